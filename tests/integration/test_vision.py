"""Images through both API families on a real worker serving builtin:tiny-vlm, called with the
official SDKs: the image reaches the model, the same image is a prefix-cache hit, formats,
several images and earlier turns, streamed equals whole, images batched beside text, every limit
a 4xx that leaves the worker serving, and image URLs (fetched from a listed local host only).

Random weights: what is asserted holds by construction (equal paths, equal greedy answers,
counts), except that two different pictures give two different answers, which the pictures are
chosen to make certain (black and white, 24 greedy tokens)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import signal
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import numpy as np
import openai
import pytest
from PIL import Image as PILImage

from tests.support.files_server import serving
from tests.support.gateway import Gateway
from tests.support.servers import free_port, start_serve

LIMITS = (
    "--max-images",
    "3",
    "--max-image-mb",
    "0.05",
    "--max-image-pixels",
    "40000",
    "--max-request-image-pixels",
    "50000",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    health = tmp_path_factory.mktemp("vlm") / "health.sock"
    s = start_serve(
        "builtin:tiny-vlm",
        "--timeout",
        "60",
        *LIMITS,
        "--allow-image-urls",
        "--allowed-image-hosts",
        "127.0.0.1",
        "--health-socket",
        str(health),
    )
    s.health = health
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)


def picture(kind: str, fmt: str = "PNG", size=(100, 60)) -> bytes:
    """A deterministic picture: ``black``, ``white`` or ``noise``."""
    if kind == "noise":
        pixels = (np.random.default_rng(7).random((size[1], size[0], 3)) * 255).astype(np.uint8)
        image = PILImage.fromarray(pixels)
    else:
        image = PILImage.new("RGB", size, (0, 0, 0) if kind == "black" else (255, 255, 255))
    out = io.BytesIO()
    image.save(out, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def oa_image(data: bytes, media_type: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{b64(data)}"}}


def an_image(data: bytes, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(data)}}


def oa_ask(oa, *parts: dict, max_tokens: int = 12, history: tuple = (), model: str = "m", **kw):
    content = [{"type": "text", "text": "What is in the picture?"}, *parts]
    messages = [*history, {"role": "user", "content": content}]
    return oa.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def an_ask(an, *blocks: dict, max_tokens: int = 12):
    content = [{"type": "text", "text": "What is in the picture?"}, *blocks]
    return an.messages.create(
        model="m",
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": content}],
        extra_body={"temperature": 0},
    )


def cache(server) -> dict:
    return httpx.get(server.url + "/v1/status").json()["cache"]


def test_the_entry_says_it_takes_images(server):
    [card] = httpx.get(server.url + "/v1/models").json()["data"]
    assert card["vision"] is True
    assert httpx.get(server.url + "/v1/status").json()["vision"] is True
    assert "vision=True" in server.log()
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(server.health))) as daemon:  # as the daemon asks
        assert daemon.get("http://worker/health").json()["load"]["vision"] is True  # vllmmlxctl status names it


def test_the_image_reaches_the_model_and_the_same_image_again_is_a_prefix_hit(oa, server):
    black, white = picture("black"), picture("white")
    first = oa_ask(oa, oa_image(black), max_tokens=24)
    before = cache(server)
    again = oa_ask(oa, oa_image(black), max_tokens=24)
    after = cache(server)
    other = oa_ask(oa, oa_image(white), max_tokens=24)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert other.choices[0].message.content != first.choices[0].message.content
    assert after["hits"] == before["hits"] + 1
    assert after["cached_tokens"] - before["cached_tokens"] == first.usage.prompt_tokens - 1  # all but the last
    assert first.usage.prompt_tokens > 60  # the image's tokens are counted (16 per tile, 3 tiles here)


@pytest.mark.parametrize("fmt, media_type", [("PNG", "image/png"), ("JPEG", "image/jpeg")])
def test_png_and_jpeg_in_both_families_give_one_answer(oa, an, fmt, media_type):
    data = picture("noise", fmt)
    ours = oa_ask(oa, oa_image(data, media_type))
    theirs = an_ask(an, an_image(data, media_type))
    assert ours.choices[0].message.content == theirs.content[0].text
    assert ours.usage.prompt_tokens == theirs.usage.input_tokens
    counted = an.messages.count_tokens(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "What is in the picture?"}, an_image(data, media_type)],
            }
        ],
    )
    assert counted.input_tokens == theirs.usage.input_tokens


def test_two_images_in_one_message_and_an_image_in_an_earlier_turn(oa, an):
    black, white = picture("black"), picture("white", size=(60, 60))
    one = oa_ask(oa, oa_image(black))
    two = oa_ask(oa, oa_image(black), oa_image(white))
    assert two.usage.prompt_tokens > one.usage.prompt_tokens + 60  # the second picture's tiles are there too
    history = (
        {"role": "user", "content": [{"type": "text", "text": "Remember this."}, oa_image(white)]},
        {"role": "assistant", "content": "I will."},
    )
    earlier = oa_ask(oa, oa_image(black), history=history)
    assert earlier.usage.prompt_tokens > two.usage.prompt_tokens  # both images, and the earlier turn's text
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "Remember this."}, an_image(white)]},
        {"role": "assistant", "content": "I will."},
        {"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}, an_image(black)]},
    ]
    m = an.messages.create(model="m", max_tokens=12, messages=turns, extra_body={"temperature": 0})
    assert m.content[0].text == earlier.choices[0].message.content


def test_streamed_equals_whole_in_both_families(oa, an):
    data = picture("noise")
    whole = oa_ask(oa, oa_image(data)).choices[0].message.content
    chunks = oa_ask(oa, oa_image(data), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    content = [{"type": "text", "text": "What is in the picture?"}, an_image(data)]
    with an.messages.stream(
        model="m", max_tokens=12, messages=[{"role": "user", "content": content}], extra_body={"temperature": 0}
    ) as stream:
        assert "".join(stream.text_stream) == whole


def test_image_requests_batch_beside_text_ones_whose_answers_do_not_change(oa):
    texts = [f"Tell me about {topic}." for topic in ("cats", "rivers", "bread", "the moon")]

    def text(prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        r = oa.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
        return r.choices[0].message.content

    alone = [text(t) for t in texts]
    pictures = [picture(k, size=s) for k in ("black", "white", "noise") for s in ((100, 60), (64, 64))][:4]
    with ThreadPoolExecutor(8) as pool:
        images = [pool.submit(lambda d: oa_ask(oa, oa_image(d), max_tokens=16), d) for d in pictures]
        together = [pool.submit(text, t) for t in texts]
        assert [f.result() for f in together] == alone
        assert all(f.result().choices[0].finish_reason in ("stop", "length") for f in images)


def corrupt(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "part, status, words",
    [
        (oa_image(picture("noise", size=(200, 150))), 413, "larger than this model's"),  # ~90 KB of 50 KB
        (oa_image(picture("black", size=(300, 200))), 400, "more pixels than this model's 40,000"),
        (oa_image(corrupt(picture("noise"))), 400, "truncated or cannot be decoded"),
        (oa_image(b"GIF89a" + b"\x00" * 40), 400, "declared image/png but its data is image/gif"),
        (oa_image(b"hello, not an image"), 400, "not a PNG, JPEG, WebP or GIF"),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}},
            400,
            "must be data:<media type>;base64",
        ),
    ],
)
def test_each_limit_is_its_4xx_and_the_worker_keeps_serving(oa, part, status, words):
    with pytest.raises(openai.APIStatusError) as err:
        oa_ask(oa, part)
    assert err.value.status_code == status and words in err.value.message
    assert oa_ask(oa, oa_image(picture("black")), max_tokens=2).choices[0].finish_reason in ("stop", "length")


def test_too_many_images_in_a_conversation_is_a_400_in_anthropics_shape(server):
    black = an_image(picture("black"))
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [black, black, black, black]}]}
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "has 4 images; this model takes at most 3" in r.json()["error"]["message"]


def test_images_within_the_per_image_limit_are_refused_together_when_the_request_is_over(oa, server):
    # The shape of the finding (16 PNGs of 6000x6000 decoded before admission), scaled to this entry.
    part = oa_image(picture("black", size=(180, 150)))  # 27,000 pixels: within 40,000 alone
    with pytest.raises(openai.BadRequestError) as err:
        oa_ask(oa, part, part)
    assert "2 images have 54,000 pixels together" in err.value.message
    assert httpx.get(server.url + "/v1/status").json()["images"]["held"] == 0  # nothing decoded, nothing held
    assert oa_ask(oa, part, max_tokens=2).choices[0].finish_reason in ("stop", "length")


# 32 MB of zeros in ~32 KB: within the entry's 50 KB as sent, a body a worker must never inflate.
BOMB = gzip.compress(bytes(32 * 1024 * 1024), compresslevel=9)


@pytest.fixture(scope="module")
def pictures():
    bomb = (200, {"Content-Type": "image/png", "Content-Encoding": "gzip"}, BOMB)
    with serving({"/a.png": (200, {"Content-Type": "image/png"}, picture("noise")), "/bomb.png": bomb}) as port:
        yield port


def test_a_compressed_image_body_is_refused_without_being_inflated(oa, pictures):
    with pytest.raises(openai.BadRequestError) as err:
        oa_ask(oa, {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{pictures}/bomb.png"}})
    assert "gzip-encoded body" in err.value.message and "never inflated" in err.value.message
    assert oa_ask(oa, oa_image(picture("black")), max_tokens=2).choices[0].finish_reason in ("stop", "length")


def test_an_image_url_is_fetched_from_a_listed_host_only(oa, pictures):
    by_url = oa_ask(oa, {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{pictures}/a.png"}})
    by_data = oa_ask(oa, oa_image(picture("noise")))
    assert by_url.choices[0].message.content == by_data.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:  # loopback too, but not listed
        oa_ask(oa, {"type": "image_url", "image_url": {"url": f"http://localhost:{pictures}/a.png"}})
    assert "allowed_image_hosts" in err.value.message


def test_the_gateway_routes_image_requests_like_any_other(server, oa, pictures):
    port = free_port()
    route = {"name": "eyes", "served_model_name": "tiny-vlm", "url": server.url, "state": "ready"}
    gw = Gateway({"gateway": {"host": "127.0.0.1", "port": port}, "routes": [route], "version": 1}, port)
    try:
        via = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=60)
        direct = oa_ask(oa, oa_image(picture("noise"))).choices[0].message.content
        assert oa_ask(via, oa_image(picture("noise")), model="tiny-vlm").choices[0].message.content == direct
        # The compression bomb, through the gateway: refused by the worker, never inflated.
        with pytest.raises(openai.BadRequestError) as err:
            oa_ask(
                via,
                {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{pictures}/bomb.png"}},
                model="tiny-vlm",
            )
        assert "never inflated" in err.value.message
    finally:
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.wait() == 0, gw.log()[-3000:]


def test_the_responses_api_takes_an_input_image_as_chat_does(oa):
    data = picture("noise")
    url = f"data:image/png;base64,{b64(data)}"
    content = [{"type": "input_text", "text": "What is in the picture?"}, {"type": "input_image", "image_url": url}]
    r = oa.responses.create(
        model="m", input=[{"role": "user", "content": content}], max_output_tokens=12, temperature=0
    )
    assert r.output_text == oa_ask(oa, oa_image(data)).choices[0].message.content


def test_structured_output_tools_and_stops_hold_with_an_image(oa):
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 8}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    r = oa_ask(oa, oa_image(picture("black")), max_tokens=40, response_format=fmt, seed=1)
    assert set(json.loads(r.choices[0].message.content)) == {"colour"}
    tool = {"type": "function", "function": {"name": "describe", "parameters": schema}}
    forced = {"type": "function", "function": {"name": "describe"}}
    r = oa_ask(oa, oa_image(picture("white")), max_tokens=40, tools=[tool], tool_choice=forced)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "describe" and set(json.loads(call.function.arguments)) == {"colour"}
    whole = oa_ask(oa, oa_image(picture("noise")), max_tokens=12).choices[0].message.content
    stop = whole[len(whole) // 2 :][:3]  # text the greedy answer holds: it ends at its first occurrence
    cut = oa_ask(oa, oa_image(picture("noise")), max_tokens=12, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].message.content
    assert whole.startswith(cut.choices[0].message.content)


def test_ollamas_images_are_the_same_image_parts(server, oa):
    """Ollama's ``images`` (base64, no media type) on the worker's Ollama routes: the image before
    the text, as the same request in OpenAI's words gives the same prompt and the same greedy answer."""
    import ollama

    data = picture("noise")
    question = "What is in the picture?"
    client = ollama.Client(host=server.url + "/ollama", timeout=60)
    ours = client.chat(
        model="m",
        messages=[{"role": "user", "content": question, "images": [data]}],
        options={"num_predict": 12, "temperature": 0},
    )
    theirs = oa.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": [oa_image(data), {"type": "text", "text": question}]}],
        max_tokens=12,
        temperature=0,
    )
    assert ours.message.content == theirs.choices[0].message.content
    assert ours.prompt_eval_count == theirs.usage.prompt_tokens > 60
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model="m", messages=[{"role": "user", "content": question, "images": [b64(b"not an image")]}])
    assert bad.value.status_code == 400 and "images[0]" in bad.value.error
