"""Images in requests, before any model: sources, signatures, limits, decoding, keys, and which
remote URLs may be fetched."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image as PILImage

from vllmmlxd.api import images as im
from vllmmlxd.errors import InvalidRequest, PayloadTooLarge

LIMITS = im.ImageLimits()


def encoded(fmt: str, size=(6, 4), colour=(200, 30, 30), **save) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, colour).save(out, fmt, **save)
    return out.getvalue()


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize(
    "fmt, media_type, save",
    [
        ("PNG", "image/png", {}),
        ("JPEG", "image/jpeg", {}),
        ("WEBP", "image/webp", {"lossless": True}),
        ("GIF", "image/gif", {}),
    ],
)
def test_each_format_decodes_from_a_data_url_and_from_base64(fmt, media_type, save):
    data = encoded(fmt, **save)
    url = im.from_data_url(data_url(media_type, data), "messages[0].content[1]", LIMITS)
    b64 = im.from_base64(media_type, base64.b64encode(data).decode(), "messages[0].content[1]", LIMITS)
    assert url == b64 and url.media_type == media_type
    image = im.decode(url, LIMITS)
    assert (image.width, image.height) == (6, 4) and image.pixels.mode == "RGB"


def test_the_key_is_the_pixels_not_the_file():
    png = im.decode(im.from_base64("image/png", base64.b64encode(encoded("PNG")).decode(), "x", LIMITS), LIMITS)
    webp = encoded("WEBP", lossless=True)
    same = im.decode(im.from_base64("image/webp", base64.b64encode(webp).decode(), "x", LIMITS), LIMITS)
    other = im.decode(
        im.from_base64("image/png", base64.b64encode(encoded("PNG", colour=(30, 200, 30))).decode(), "x", LIMITS),
        LIMITS,
    )
    assert png.key == same.key != other.key
    wider = encoded("PNG", size=(4, 6))  # the same bytes of pixels in another shape: another image
    assert im.decode(im.from_base64("image/png", base64.b64encode(wider).decode(), "x", LIMITS), LIMITS).key != png.key


def test_a_jpegs_orientation_is_applied_and_a_gif_gives_its_first_frame():
    exif = PILImage.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    jpeg = encoded("JPEG", size=(6, 4), exif=exif.tobytes())
    upright = im.decode(im.from_base64("image/jpeg", base64.b64encode(jpeg).decode(), "x", LIMITS), LIMITS)
    assert (upright.width, upright.height) == (4, 6)
    frames = [PILImage.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    first = im.decode(im.from_base64("image/gif", base64.b64encode(out.getvalue()).decode(), "x", LIMITS), LIMITS)
    red, _green, blue = first.pixels.getpixel((1, 1))
    assert red > 200 and blue < 50


@pytest.mark.parametrize(
    "media_type, text, words",
    [
        ("image/png", base64.b64encode(encoded("GIF")).decode(), "declared image/png but its data is image/gif"),
        ("image/tiff", base64.b64encode(b"II*\x00").decode(), "media type 'image/tiff' is not supported"),
        ("image/png", "not base64!!", "not valid base64"),
        ("image/png", base64.b64encode(b"just some text").decode(), "not a PNG, JPEG, WebP or GIF"),
        ("image/png", "", "non-empty base64"),
    ],
)
def test_what_is_not_an_image_of_its_type_is_a_400_naming_the_part(media_type, text, words):
    with pytest.raises(InvalidRequest) as err:
        im.from_base64(media_type, text, "messages[2].content[0]", LIMITS)
    assert words in err.value.message and err.value.param == "messages[2].content[0]"


def test_a_truncated_image_is_a_400_at_decoding():
    png = encoded("PNG", size=(64, 64))
    source = im.from_base64("image/png", base64.b64encode(png[: len(png) // 2]).decode(), "p", LIMITS)
    with pytest.raises(InvalidRequest) as err:
        im.decode(source, LIMITS)
    assert "truncated or cannot be decoded" in err.value.message


def test_the_limits_answer_413_and_400():
    small = im.ImageLimits(max_bytes=200, max_pixels=100, max_images=2)
    big = base64.b64encode(encoded("PNG", size=(64, 64), colour=(1, 2, 3)) + b"\x00" * 300).decode()
    with pytest.raises(PayloadTooLarge):
        im.from_base64("image/png", big, "p", small)
    wide = im.from_base64("image/png", base64.b64encode(encoded("PNG", size=(20, 20))).decode(), "p", LIMITS)
    with pytest.raises(InvalidRequest) as err:
        im.decode(wide, small)  # 400 pixels, of 100: refused from the header
    assert "(20x20)" in err.value.message
    sources = [im.Source("image/png", b"", f"messages[{n}].content[0]") for n in range(3)]
    with pytest.raises(InvalidRequest) as err:
        im.count_checked(sources, small)
    assert err.value.param == "messages[2].content[0]" and "at most 2" in err.value.message
    im.count_checked(sources[:2], small)


def test_a_data_url_must_be_base64_with_a_type():
    for url in ("data:image/png,abc", "http://x/y.png", "data:;base64,AAAA"):
        with pytest.raises(InvalidRequest):
            im.from_data_url(url, "u", LIMITS)


@pytest.mark.parametrize(
    "url, addresses, allowed, refused",
    [
        ("https://images.example.com/a.png", ["93.184.216.34"], (), None),
        ("https://images.example.com/a.png", ["2606:2800:220:1:248:1893:25c8:1946"], (), None),
        ("http://localhost:8080/a.png", ["127.0.0.1"], (), "loopback, private or reserved"),
        ("http://x.example/a.png", ["::ffff:127.0.0.1"], (), "loopback, private or reserved"),
        ("http://x.example/a.png", ["10.1.2.3"], (), "loopback, private or reserved"),
        ("http://x.example/a.png", ["169.254.169.254"], (), "loopback, private or reserved"),  # cloud metadata
        ("http://x.example/a.png", ["93.184.216.34", "192.168.1.10"], (), "loopback, private or reserved"),
        ("http://nas.local/a.png", ["192.168.1.10"], ("NAS.local",), None),
        ("ftp://x.example/a.png", ["93.184.216.34"], (), "http:// or https://"),
        ("https://user:pw@x.example/a.png", ["93.184.216.34"], (), "credentials"),
        ("https://nowhere.example/a.png", [], (), "does not resolve"),
        # IPv6 forms of IPv4 (and deprecated ranges) that Python's is_global calls global (issue 37).
        *[
            ("http://x.example/a.png", [v6], (), "loopback, private or reserved")
            for v6 in ("::7f00:1", "64:ff9b::a00:1", "64:ff9b:1::1", "2002:7f00:1::1", "2001:0:4136:e378::1", "fec0::1")
        ],
    ],
)
def test_which_image_urls_may_be_fetched(url, addresses, allowed, refused):
    verdict = im.url_verdict(url, addresses, allow=True, allowed_hosts=allowed)
    assert verdict is None if refused is None else refused in verdict


def test_no_url_is_fetched_unless_the_entry_allows_it():
    verdict = im.url_verdict("https://images.example.com/a.png", ["93.184.216.34"], allow=False, allowed_hosts=())
    assert "allow_image_urls is off" in verdict
