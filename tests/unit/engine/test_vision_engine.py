"""The engine on builtin:tiny-vlm, against mlx-vlm's own paths: a conversation with images renders
to the ids mlx-vlm's processor makes of it, and a greedy answer is the one mlx-vlm's generate
gives; a client's own ``<image>`` text stays text."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest
from PIL import Image as PILImage

from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.types import DecodedImage, Finished, GenerationRequest, SamplingParams, TextDelta
from vllmmlxd.engine.vision.vision_prompt import unsupported_family
from vllmmlxd.errors import InvalidRequest


@pytest.fixture(scope="module")
def engine(state_dir):
    from vllmmlxd.engine.loading.loader import load_model

    engine = MLXEngine(load_model("builtin:tiny-vlm", state_dir))
    yield engine
    engine.close()


def picture(seed: int, size: tuple[int, int]) -> DecodedImage:
    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype(np.uint8)
    image = PILImage.fromarray(pixels)
    return DecodedImage(image, image.width, image.height, hashlib.sha256(pixels.tobytes()).hexdigest())


def asking(*images: DecodedImage, text: str = "What is in these?") -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "text", "text": text}, *({"type": "image", "image": i} for i in images)]}
    ]


def without_pixels(messages: list[dict]) -> list[dict]:
    return [
        {**m, "content": [{"type": p["type"], **({"text": p["text"]} if "text" in p else {})} for p in m["content"]]}
        for m in messages
    ]


def test_a_conversation_renders_to_the_ids_mlx_vlms_processor_makes(engine):
    wide, small = picture(1, (200, 90)), picture(2, (30, 30))
    # Resized to a 128 px long edge: 128 x 58 is 1 x 2 tiles, 128 x 128 is 2 x 2, each with a global tile.
    messages = asking(wide, small)
    rendered = engine.render(messages)
    text = engine.tokenizer.apply_chat_template(without_pixels(messages), add_generation_prompt=True, tokenize=False)
    theirs = engine._images.processor(text=text, images=[[wide.pixels, small.pixels]])["input_ids"][0].tolist()
    assert rendered.tokens == theirs
    first, second = rendered.images
    assert first.key == wide.key and second.key == small.key and first.end <= second.start
    placeholder = engine._images.placeholder_id
    assert rendered.tokens[first.start : first.end].count(placeholder) == 3 * 16
    assert rendered.tokens[second.start : second.end].count(placeholder) == 5 * 16


def test_a_clients_image_token_text_is_text_and_cannot_add_an_image(engine):
    rendered = engine.render(asking(picture(1, (40, 40)), text="<image><image> look"))
    [span] = rendered.images
    placeholder = engine._images.placeholder_id
    outside = rendered.tokens[: span.start] + rendered.tokens[span.end :]
    assert placeholder not in outside and "<image><image> look" in engine.tokenizer.decode(outside)


def test_more_images_than_the_template_placed_is_a_400(engine):
    tokens = engine.apply_chat_template([{"role": "user", "content": "no image here"}])
    with pytest.raises(InvalidRequest, match="placed 0 of the request's 1 images"):
        engine._images.expand(tokens, [picture(1, (40, 40))])


def test_a_greedy_answer_equals_mlx_vlms_generate(engine):
    from mlx_vlm import generate

    image = picture(3, (100, 60))
    rendered = engine.render(asking(image))

    async def answer() -> tuple[str, Finished]:
        request = GenerationRequest(
            rendered.tokens, SamplingParams(max_tokens=12, temperature=0), images=rendered.images
        )
        text, last = "", None
        async for event in engine.generate(request):
            text += event.text if isinstance(event, TextDelta) else ""
            last = event if isinstance(event, Finished) else last
        assert last is not None
        return text, last

    ours, finished = asyncio.run(answer())
    prompt = engine.tokenizer.apply_chat_template(
        without_pixels(asking(image)), add_generation_prompt=True, tokenize=False
    )
    loaded = engine._images.processor
    theirs = generate(
        engine._scheduler.vision.vision_model, loaded, prompt, image=[image.pixels], max_tokens=12, temperature=0.0
    )
    assert ours == theirs.text and finished.usage.prompt_tokens == theirs.prompt_tokens == len(rendered.tokens)


def test_families_without_a_layout_are_refused_by_name():
    assert unsupported_family("smolvlm") is None and unsupported_family("idefics3") is None
    assert "qwen2_vl" in (unsupported_family("qwen2_vl") or "") and "smolvlm" in (unsupported_family("qwen2_vl") or "")
