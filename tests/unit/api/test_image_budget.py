"""The decode budget (api/image_budget.py, api/image_input.py): a request's images are measured
from their headers and refused together before any is decoded, and the worker holds at most its
budget of decoded pixels at once, each image's share coming back when the image is freed."""

from __future__ import annotations

import asyncio
import base64
import gc
import io
from typing import cast

import pytest
from PIL import Image as PILImage

from tests.unit.api.test_image_input import InfoOnly
from vllmmlxd.api import images
from vllmmlxd.api.context import ServingContext
from vllmmlxd.api.image_budget import PixelBudget
from vllmmlxd.api.image_input import resolve_images
from vllmmlxd.api.images import ImageRef, image_part
from vllmmlxd.api.turn import ChatPrompt
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.engine.types import Engine, ModelInfo
from vllmmlxd.errors import InvalidRequest, Overloaded


def png(size: tuple[int, int], mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    PILImage.new(mode, size).save(out, "PNG")
    return out.getvalue()


def prompt_of(data: bytes, n: int) -> ChatPrompt:
    text = base64.b64encode(data).decode()
    parts = [image_part(ImageRef(f"messages[0].content[{i}]", media_type="image/png", data=text)) for i in range(n)]
    return ChatPrompt([{"role": "user", "content": parts}])


async def until(predicate, timeout: float = 5.0) -> None:
    """Let the loop run until ``predicate()`` holds; fails past ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def ctx_with(budget: PixelBudget | None = None, **config) -> ServingContext:
    engine = cast(Engine, InfoOnly(ModelInfo("tiny", 2048, 100, "builtin:tiny", vision=True)))  # what is read: info
    model = ResolvedModel(model="builtin:tiny", **config)
    return ServingContext(
        engine=engine, config=model, key="pics", pixels=budget or PixelBudget(model.image_pixel_budget)
    )


@pytest.fixture
def decodes(monkeypatch):
    calls: list[str] = []
    real = images.decode

    def counted(source, limits):
        calls.append(source.where)
        return real(source, limits)

    monkeypatch.setattr(images, "decode", counted)
    return calls


def test_sixteen_large_canvases_are_refused_together_before_one_is_decoded(decodes):
    # The finding: 16 PNGs of 6000x6000 (a 2 MB request) each within the per-image limit, which
    # a worker decoded before admission (3.1 GB). Their headers alone refuse them now.
    prompt = prompt_of(png((6000, 6000), "1"), 16)
    with pytest.raises(InvalidRequest, match=r"16 images have 576,000,000 pixels together; .* 100,000,000 per request"):
        asyncio.run(resolve_images(ctx_with(), prompt))
    assert decodes == []


def test_a_request_larger_than_the_worker_s_budget_is_a_400():
    with pytest.raises(InvalidRequest, match="decodes at most 1,000 at once"):
        asyncio.run(resolve_images(ctx_with(PixelBudget(1000)), prompt_of(png((40, 30)), 1)))


def test_decoded_images_hold_their_pixels_until_freed_and_a_request_that_does_not_fit_waits():
    budget = PixelBudget(2 * 40 * 30)
    ctx = ctx_with(budget)

    async def scenario():
        first = await resolve_images(ctx, prompt_of(png((40, 30)), 2))
        assert budget.held == 2400
        second = asyncio.create_task(resolve_images(ctx, prompt_of(png((40, 30)), 1)))
        # Queued (or, had it been let in, done): no room while the first holds its images.
        await until(lambda task=second: budget.describe()["waiting"] == 1 or task.done())
        assert not second.done() and budget.held == 2400
        del first  # the first request is done with its images
        got = await asyncio.wait_for(second, 5)
        assert budget.held == 1200
        del got, second  # the task holds its result too
        # The give-back is scheduled on the loop once the last reference goes, which the loop's own
        # callbacks of the finished task may hold a little longer.
        for _ in range(500):
            if budget.held == 0:
                break
            gc.collect()
            await asyncio.sleep(0.01)
        return budget.held

    assert asyncio.run(scenario()) == 0


def test_a_request_that_waits_too_long_gets_a_503_and_leaves_the_queue(monkeypatch):
    budget = PixelBudget(1000)

    async def scenario():
        await budget.take(800)
        with pytest.raises(Overloaded):
            await budget.take(500, wait_s=0.1)
        assert budget.describe() == {"capacity": 1000, "held": 800, "waiting": 0}
        budget.give(800)
        await budget.take(1000, wait_s=0.1)

    asyncio.run(scenario())


def test_waiting_requests_go_first_come_first_served_and_a_cancelled_one_takes_nothing():
    budget = PixelBudget(1000)

    async def scenario():
        await budget.take(900)
        order: list[str] = []

        async def wait(name: str, n: int):
            await budget.take(n)
            order.append(name)

        big = asyncio.create_task(wait("big", 800))
        await asyncio.sleep(0)
        small = asyncio.create_task(wait("small", 100))  # would fit now, but comes after the big one
        gone = asyncio.create_task(wait("gone", 50))
        # All three queued: one let in past the big one would be in ``order`` by then.
        await until(lambda: budget.describe()["waiting"] == 3 or bool(order))
        assert order == []
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert budget.describe() == {"capacity": 1000, "held": 900, "waiting": 2}
        budget.give(900)
        await asyncio.wait_for(asyncio.gather(big, small), 2)
        assert order == ["big", "small"] and budget.held == 900

    asyncio.run(scenario())


def test_a_failed_decode_gives_its_pixels_back(monkeypatch):
    budget = PixelBudget(10_000)
    truncated = png((40, 30))
    prompt = prompt_of(truncated, 1)

    def broken(source, limits):
        raise InvalidRequest("the image data is truncated or cannot be decoded")

    monkeypatch.setattr(images, "decode", broken)
    with pytest.raises(InvalidRequest):
        asyncio.run(resolve_images(ctx_with(budget), prompt))
    assert budget.held == 0
