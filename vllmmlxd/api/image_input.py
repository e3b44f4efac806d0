"""A request's images, from the parts its translator left (``images.ImageRef``) to decoded pictures
the engine's processor takes: the step of the chat pipeline between translating and rendering.

A text model refuses any image, naming itself. For a vision model every image of the whole
conversation is counted against the entry's ``max_images``, read (a data URL, base64 data, or a
fetched ``http(s)`` URL when ``allow_image_urls`` is on) within ``max_image_mb``, measured from
their headers within ``max_image_pixels`` each and ``max_request_image_pixels`` together, then
decoded off the event loop once the worker's decode budget (``image_budget``) has room for
them; each decoded image holds its share of the budget until it is freed. Done once per
request: a tool loop or a truncation renders the same decoded images again.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from ..engine.types import DecodedImage
from ..errors import InvalidRequest
from . import images
from .context import ServingContext
from .image_budget import PixelBudget
from .image_fetch import fetch
from .images import ImageLimits, ImageRef, Source
from .turn import ChatPrompt

MB = 1024 * 1024


def limits_of(ctx: ServingContext) -> ImageLimits:
    config = ctx.config
    return ImageLimits(
        int(config.max_image_mb * MB), config.max_image_pixels, config.max_images, config.max_request_image_pixels
    )


def refs_in(messages: list[dict[str, Any]]) -> list[ImageRef]:
    """The image parts of a conversation, in order."""
    return [
        part["image"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and isinstance(part.get("image"), ImageRef)
    ]


async def resolve_images(ctx: ServingContext, prompt: ChatPrompt) -> ChatPrompt:
    """``prompt`` with each image part's reference replaced by its decoded picture; a 400 (or
    413) naming the part when one cannot be had, or when this model takes no images."""
    refs = refs_in(prompt.messages)
    if not refs:
        return prompt
    if not ctx.engine.info.vision:
        raise InvalidRequest(
            f"{refs[0].where}: the model {ctx.name!r} takes text only; send images to a vision model",
            param=refs[0].where,
        )
    limits = limits_of(ctx)
    images.count_checked(refs, limits)  # before anything is read or fetched
    sources = [await _source(ctx, ref, limits) for ref in refs]
    sizes = await asyncio.to_thread(lambda: [images.canvas(s, limits) for s in sources])
    images.total_checked(sources, sizes, limits)  # before a pixel is decoded
    decoded = await _decoded(ctx.pixels, sources, sum(sizes), limits)
    by_ref = dict(zip(map(id, refs), decoded))
    return replace(prompt, messages=[_with_images(m, by_ref) for m in prompt.messages])


async def _decoded(
    budget: PixelBudget | None, sources: list[Source], pixels: int, limits: ImageLimits
) -> list[DecodedImage]:
    """The sources decoded once the worker's budget has room for ``pixels``; each image then holds
    its own share until it is freed, and what none holds (a failed decode) goes back at once."""
    if budget is None:
        return await asyncio.to_thread(lambda: [images.decode(s, limits) for s in sources])
    await budget.take(pixels)
    held = 0
    try:
        decoded = await asyncio.to_thread(lambda: [images.decode(s, limits) for s in sources])
        for image in decoded:
            share = min(image.width * image.height, pixels - held)
            budget.hold(image, share)
            held += share
        return decoded
    finally:
        budget.give(pixels - held)


async def _source(ctx: ServingContext, ref: ImageRef, limits: ImageLimits) -> Source:
    if ref.url is not None:
        if ref.url.startswith("data:"):
            return images.from_data_url(ref.url, ref.where, limits)
        config = ctx.config
        return await fetch(
            ref.url,
            ref.where,
            limits,
            allow=config.allow_image_urls,
            allowed_hosts=config.allowed_image_hosts,
            timeout=config.image_url_timeout,
        )
    return images.from_base64(ref.media_type, ref.data, ref.where, limits, sniffed=ref.media_type is None)


def _with_images(message: dict[str, Any], by_ref: dict[int, DecodedImage]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = [
        {"type": "image", "image": by_ref[id(p["image"])]}
        if isinstance(p, dict) and isinstance(p.get("image"), ImageRef)
        else p
        for p in content
    ]
    return {**message, "content": parts}
