"""A request's image parts resolved before rendering (api/image_input.py), and image URLs fetched
from a real local HTTP server (api/image_fetch.py): what a text model says, counts before reads,
data without a declared type, and the SSRF rules on every hop."""

from __future__ import annotations

import asyncio
import base64
import io
from dataclasses import dataclass

import pytest
from PIL import Image as PILImage

from tests.support.files_server import serving
from vllmmlxd.api.context import ServingContext
from vllmmlxd.api.image_fetch import fetch
from vllmmlxd.api.image_input import resolve_images
from vllmmlxd.api.images import ImageLimits, ImageRef, image_part
from vllmmlxd.api.turn import ChatPrompt
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.engine.types import DecodedImage, ModelInfo
from vllmmlxd.errors import InvalidRequest, PayloadTooLarge


def png(colour=(200, 30, 30), size=(8, 6)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


@dataclass
class InfoOnly:
    info: ModelInfo


def ctx_for(vision: bool, **config) -> ServingContext:
    engine = InfoOnly(ModelInfo("tiny", 2048, 100, "builtin:tiny", vision=vision))
    return ServingContext(engine=engine, config=ModelConfig(model="builtin:tiny", **config), key="pics")  # type: ignore[arg-type]


def prompt_with(*refs: ImageRef) -> ChatPrompt:
    return ChatPrompt([{"role": "user", "content": [{"type": "text", "text": "look"}, *map(image_part, refs)]}])


def ref(where="messages[0].content[1]", data: bytes | str = b"", media_type="image/png") -> ImageRef:
    text = data if isinstance(data, str) else base64.b64encode(data).decode()
    return ImageRef(where, media_type=media_type, data=text)


def test_a_text_model_refuses_an_image_naming_itself_and_the_part():
    with pytest.raises(InvalidRequest) as err:
        asyncio.run(resolve_images(ctx_for(False), prompt_with(ref(data=png()))))
    assert "'pics' takes text only" in err.value.message and err.value.param == "messages[0].content[1]"


def test_images_are_counted_before_any_is_read_and_decoded_ones_replace_the_parts():
    too_many = prompt_with(*(ref(f"messages[0].content[{n}]", data="not base64!") for n in range(1, 4)))
    with pytest.raises(InvalidRequest, match="has 3 images; this model takes at most 2"):
        asyncio.run(resolve_images(ctx_for(True, max_images=2), too_many))
    untyped = ImageRef("messages[0].images[0]", data=base64.b64encode(png()).decode())  # Ollama's: no media type
    resolved = asyncio.run(resolve_images(ctx_for(True), prompt_with(ref(data=png((1, 2, 3))), untyped)))
    parts = resolved.messages[0]["content"]
    assert parts[0] == {"type": "text", "text": "look"}
    assert (
        all(isinstance(p["image"], DecodedImage) for p in parts[1:]) and parts[1]["image"].key != parts[2]["image"].key
    )
    text_only = ChatPrompt([{"role": "user", "content": "hi"}])
    assert asyncio.run(resolve_images(ctx_for(False), text_only)) is text_only


def test_the_entrys_limits_apply():
    big = ref(data=png(size=(300, 300)))
    with pytest.raises(PayloadTooLarge):
        asyncio.run(resolve_images(ctx_for(True, max_image_mb=0.0001), prompt_with(big)))
    with pytest.raises(InvalidRequest, match="more pixels than this model's 1,000"):
        asyncio.run(resolve_images(ctx_for(True, max_image_pixels=1000), prompt_with(big)))


def test_an_image_url_is_refused_unless_the_entry_allows_it():
    url = ImageRef("messages[0].content[1]", url="http://127.0.0.1:9/a.png")
    with pytest.raises(InvalidRequest, match="allow_image_urls is off"):
        asyncio.run(resolve_images(ctx_for(True), prompt_with(url)))


# -- fetching, from a real server on loopback ----------------------------------------------


@pytest.fixture(scope="module")
def server():
    routes: dict = {}
    with serving(routes) as port:
        routes |= {
            "/a.png": (200, {"Content-Type": "image/png"}, png()),
            "/hop": (302, {"Location": "/a.png"}, b""),
            "/to-localhost": (302, {"Location": f"http://localhost:{port}/a.png"}, b""),
            "/text": (200, {}, b"<html>not an image</html>"),
            "/big": (200, {}, png(size=(400, 400))),
            "/slow": (0, {}, b""),
        }
        yield f"http://127.0.0.1:{port}"


def fetched(url: str, *, hosts=("127.0.0.1",), limits=None, timeout=5.0):
    limits = limits or ImageLimits()
    return asyncio.run(fetch(url, "p", limits, allow=True, allowed_hosts=hosts, timeout=timeout))


def test_a_listed_hosts_image_is_fetched_following_a_redirect(server):
    assert fetched(server + "/a.png").data == png() and fetched(server + "/hop").media_type == "image/png"


@pytest.mark.parametrize(
    "path, hosts, words",
    [
        ("/a.png", (), "loopback, private or reserved"),  # 127.0.0.1 itself, not listed
        ("/to-localhost", ("127.0.0.1",), "image URL's host 'localhost'"),  # a hop to an unlisted name
        ("/text", ("127.0.0.1",), "not a PNG, JPEG, WebP or GIF"),
        ("/missing", ("127.0.0.1",), "answered HTTP 404"),
        ("/slow", ("127.0.0.1",), "within 1 s"),
    ],
)
def test_what_is_not_fetched_says_why(server, path, hosts, words):
    with pytest.raises(InvalidRequest) as err:
        fetched(server + path, hosts=hosts, timeout=1.0)
    assert words in err.value.message


def test_an_image_too_large_is_a_413_while_it_is_read(server):
    with pytest.raises(PayloadTooLarge):
        fetched(server + "/big", limits=ImageLimits(max_bytes=500))
