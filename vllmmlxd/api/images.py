"""Images in requests, checked and decoded before any model sees them. The API families'
translators leave an :class:`ImageRef` part where an image was (``image_part``); nothing here
knows a family's wire shape.

- A source is a data URL (OpenAI's ``image_url``) or base64 data with a media type (Anthropic's
  ``source``): :func:`from_data_url`, :func:`from_base64`.
- The bytes' own format, from their first bytes (PNG, JPEG, WebP, GIF), must be the one declared:
  a client that labels a GIF ``image/png`` gets a 400 naming both, never a guess.
- Limits (:class:`ImageLimits`): bytes per image (413), images per request (400), and pixels: an
  image larger than ``max_pixels``, or a request whose images together are larger than
  ``max_request_pixels``, is a 400 before any is decoded (a small file can claim a huge canvas:
  :func:`canvas` reads the header only). Images within the limits are resized by the model's
  processor, not refused. What a worker decodes at once is bounded too (``image_budget``).
- Decoding (:func:`decode`): Pillow, EXIF orientation applied, a GIF's first frame, RGB.
  Truncated or undecodable data is a 400 naming the part.
- :attr:`DecodedImage.key`: sha256 of the decoded pixels and their size, which the prefix cache keys an
  image by: the same picture re-encoded losslessly is the same image; a different one is not.
- Remote images: :func:`url_verdict` decides whether an ``http(s)://`` URL may be fetched, given
  the addresses its host resolved to (the fetch is an SSRF surface: loopback, private, link-local
  and other non-global addresses only when the entry lists the host).

Pure but for Pillow's decoding, which runs wherever the caller runs it (off the event loop).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import ipaddress
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..engine.types import DecodedImage
from ..errors import InvalidRequest, PayloadTooLarge

MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.ASCII)


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000  # width x height before resizing: a 8000 x 5000 photo
    max_images: int = 16  # per request, every turn of the conversation counted
    max_request_pixels: int = 100_000_000  # every image of a request together


@dataclass(frozen=True)
class ImageRef:
    """An image part as a family's translator found it, neither checked nor fetched: a URL
    (OpenAI's ``image_url``: ``data:`` or ``http(s)://``), or base64 ``data`` declared as
    ``media_type`` (Anthropic's source; None: any of ours, told by its bytes, as Ollama's)."""

    where: str  # its place in the request, for errors
    url: str | None = None
    media_type: str | None = None
    data: object = None


def image_part(ref: ImageRef) -> dict:
    """The content part a translator writes for an image (resolved by ``api.image_input``)."""
    return {"type": "image", "image": ref}


@dataclass(frozen=True)
class Source:
    """An image's bytes as the client sent them, with the media type it declared."""

    media_type: str
    data: bytes
    where: str  # its place in the request, for errors (``messages[0].content[1]``)


def sniff(data: bytes) -> str | None:
    """The media type the bytes' own signature names, if it is one of ours."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return None


def from_base64(
    media_type: str | None, text: object, where: str, limits: ImageLimits, *, sniffed: bool = False
) -> Source:
    """Base64 ``text`` declared as ``media_type`` (``sniffed``: none declared, the bytes tell):
    checked against the limits and its own signature."""
    if not sniffed and media_type not in MEDIA_TYPES:
        raise InvalidRequest(
            f"{where}: the image's media type {media_type!r} is not supported; use one of {', '.join(MEDIA_TYPES)}",
            param=where,
        )
    if not isinstance(text, str) or not text:
        raise InvalidRequest(f"{where}: the image data must be a non-empty base64 string", param=where)
    if len(text) > (limits.max_bytes + 2) // 3 * 4 + 4:  # refused before decoding what is too big anyway
        raise _too_big(where, limits)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}: the image data is not valid base64", param=where) from None
    if len(data) > limits.max_bytes:
        raise _too_big(where, limits)
    return checked_bytes(data, None if sniffed else media_type, where)


def checked_bytes(data: bytes, media_type: str | None, where: str) -> Source:
    """Image bytes whose signature is one of ours and, when ``media_type`` was declared, that one."""
    found = sniff(data)
    if found is None:
        raise InvalidRequest(f"{where}: the data is not a PNG, JPEG, WebP or GIF image", param=where)
    if media_type is not None and found != media_type:
        raise InvalidRequest(f"{where}: the image is declared {media_type} but its data is {found}", param=where)
    return Source(found, data, where)


def from_data_url(url: str, where: str, limits: ImageLimits) -> Source:
    """A ``data:image/...;base64,...`` URL."""
    match = DATA_URL.match(url)
    if match is None or not match.group("b64"):
        raise InvalidRequest(f"{where}: an image URL must be data:<media type>;base64,<data>", param=where)
    return from_base64((match.group("type") or "").lower(), url[match.end() :], where, limits)


def count_checked(parts: Sequence[ImageRef | Source], limits: ImageLimits) -> None:
    """A request's images, all turns together, within ``max_images``."""
    if len(parts) > limits.max_images:
        raise InvalidRequest(
            f"the request has {len(parts)} images; this model takes at most {limits.max_images}",
            param=parts[limits.max_images].where,
        )


def canvas(source: Source, limits: ImageLimits) -> int:
    """The image's width x height, from its header alone; a 400 naming it when it is over the
    per-image limit or cannot be read."""
    from PIL import Image as PILImage

    with _decoding(source, limits) as too_many:
        with PILImage.open(io.BytesIO(source.data)) as opened:
            width, height = opened.size
        if width * height > limits.max_pixels:
            raise InvalidRequest(f"{too_many} ({width}x{height})", param=source.where)
    return width * height


def total_checked(sources: Sequence[Source], sizes: Sequence[int], limits: ImageLimits) -> None:
    """A request's images, all together, within ``max_request_pixels``."""
    total = sum(sizes)
    if total > limits.max_request_pixels:
        raise InvalidRequest(
            f"the request's {len(sizes)} images have {total:,} pixels together; this model takes at most "
            f"{limits.max_request_pixels:,} per request",
            param=sources[-1].where,
        )


def decode(source: Source, limits: ImageLimits) -> DecodedImage:
    """The source's pixels, upright and RGB; a 400 naming it when they cannot be had."""
    from PIL import Image as PILImage
    from PIL import ImageOps

    with _decoding(source, limits) as too_many:
        opened = PILImage.open(io.BytesIO(source.data))
        width, height = opened.size  # from the header: refused before its pixels are decoded
        if width * height > limits.max_pixels:
            raise InvalidRequest(f"{too_many} ({width}x{height})", param=source.where)
        opened.seek(0)  # a GIF's (or an animated WebP's) first frame
        rgb = ImageOps.exif_transpose(opened).convert("RGB")
        rgb.load()
    digest = hashlib.sha256(f"rgb8:{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).hexdigest()
    return DecodedImage(rgb, rgb.width, rgb.height, digest)


@contextmanager
def _decoding(source: Source, limits: ImageLimits) -> Iterator[str]:
    """Pillow's failures as a 400 naming the part (its own bomb check, far above ours, as ours)."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    too_many = f"{source.where}: the image has more pixels than this model's {limits.max_pixels:,} per image"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            yield too_many
    except (PILImage.DecompressionBombWarning, PILImage.DecompressionBombError):
        raise InvalidRequest(too_many, param=source.where) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise InvalidRequest(
            f"{source.where}: the image data is truncated or cannot be decoded", param=source.where
        ) from None


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def url_verdict(url: str, addresses: Iterable[str], *, allow: bool, allowed_hosts: Iterable[str]) -> str | None:
    """Why an ``http(s)://`` image URL may not be fetched (None: it may), given what its host
    resolved to. Every address must be global unless the host is listed in ``allowed_hosts``: a
    name that resolves to one public and one private address is refused, as the fetch could
    reach either."""
    if not allow:
        return "image URLs are not fetched by this model (allow_image_urls is off): send the image as base64 data"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an image URL must be http:// or https:// with a host"
    if parts.username or parts.password:
        return "an image URL must not carry credentials"
    host = parts.hostname.lower().rstrip(".")
    if host in {h.lower().rstrip(".") for h in allowed_hosts}:
        return None
    found = [_address(a) for a in addresses]
    if not found:
        return f"the host {host!r} of the image URL does not resolve"
    for address in found:
        if address is None or not address.is_global or address.is_multicast or _embeds_or_deprecated(address):
            return (
                f"the image URL's host {host!r} is on a loopback, private or reserved address; "
                "list it in allowed_image_hosts to fetch from it"
            )
    return None


# IPv6 ranges Python's ``is_global`` calls global that reach IPv4 (or nothing) by other routes:
# IPv4-compatible (::a.b.c.d), NAT64 (well-known and local-use), 6to4, Teredo, and site-local.
_REFUSED_V6 = tuple(
    ipaddress.ip_network(n) for n in ("::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32", "fec0::/10")
)


def _embeds_or_deprecated(address: Address) -> bool:
    return isinstance(address, ipaddress.IPv6Address) and any(address in net for net in _REFUSED_V6)


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
    return mapped or address


def _too_big(where: str, limits: ImageLimits) -> PayloadTooLarge:
    return PayloadTooLarge(f"{where}: the image is larger than this model's {limits.max_bytes:,} bytes", param=where)
