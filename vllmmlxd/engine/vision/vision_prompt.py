"""A vision model's prompts: each image placeholder the chat template wrote becomes the model's
image tokens (its tiles' layout, as the model's own processor module lays it out), and the
image's pixels the processor's arrays for the vision tower.

Runs where the prompt is rendered, off the engine thread and off the event loop (the processor
resizes and tiles: milliseconds, up to a second for a large photo). No mlx here: the
processor's image half returns numpy, and the arrays reach mlx on the engine thread.

Only the template's placeholders count: a client's own ``<image>`` text was tokenized as text
(``engine.special_text``), so it can neither add an image nor shift one.

Families: SmolVLM (``smolvlm``) and Idefics3 (``idefics3``, SmolVLM's first release), whose
decoder is a llama that batches with text requests. Others are refused at load, naming these.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...errors import InvalidRequest
from ..types import DecodedImage, ImageSpan, RenderedPrompt

FAMILIES = ("smolvlm", "idefics3")
PREPARED_IMAGES = 32  # images whose processed arrays are kept, for a conversation rendered again


def unsupported_family(model_type: str | None) -> str | None:
    """Why a vision model of ``model_type`` cannot be served, or None when it can."""
    if model_type in FAMILIES:
        return None
    return (
        f"vision models of the {model_type!r} family are not supported yet "
        f"(supported: {', '.join(FAMILIES)}, such as SmolVLM)"
    )


class ImagePrompter:
    """Expands a rendered prompt's image placeholders; one per vision model, shared by threads."""

    def __init__(self, processor: Any, encode: Callable[[str], list[int]], placeholder_id: int):
        self.processor = processor
        self.encode = encode  # text to ids, no special tokens added
        self.placeholder_id = placeholder_id
        self._layout = importlib.import_module(type(processor).__module__).get_image_prompt_string
        self._prepared: OrderedDict[str, tuple[list[int], dict]] = OrderedDict()
        self._lock = threading.Lock()

    def expand(self, tokens: list[int], images: list[DecodedImage]) -> RenderedPrompt:
        """``tokens`` with the k-th placeholder replaced by the k-th image's tokens."""
        places = [i for i, t in enumerate(tokens) if t == self.placeholder_id]
        if len(places) != len(images):
            raise InvalidRequest(
                f"this model's chat template placed {len(places)} of the request's {len(images)} images",
                param="messages",
            )
        out: list[int] = []
        spans: list[ImageSpan] = []
        last = 0
        for place, image in zip(places, images):
            out += tokens[last:place]
            ids, inputs = self.prepare(image)
            spans.append(ImageSpan(len(out), len(ids), image.key, inputs))
            out += ids
            last = place + 1
        out += tokens[last:]
        return RenderedPrompt(out, tuple(spans))

    def prepare(self, image: DecodedImage) -> tuple[list[int], dict]:
        """An image's tokens and the vision tower's inputs (numpy), kept for a while by its key:
        the same image in a conversation rendered again (a tool loop, a resent history) is not
        resized and tiled again."""
        with self._lock:
            if image.key in self._prepared:
                self._prepared.move_to_end(image.key)
                return self._prepared[image.key]
        processor = self.processor
        arrays = dict(processor.image_processor([[image.pixels]], return_row_col_info=True, return_tensors="np"))
        rows, cols = arrays.pop("rows")[0][0], arrays.pop("cols")[0][0]
        global_token = getattr(processor, "global_image_token", None) or processor.global_image_tag
        text = self._layout(
            rows, cols, processor.image_seq_len, processor.fake_image_token, processor.image_token, global_token
        )
        prepared = (self.encode(text), arrays)
        with self._lock:
            self._prepared[image.key] = prepared
            while len(self._prepared) > PREPARED_IMAGES:
                self._prepared.popitem(last=False)
        return prepared


def image_parts(messages: list[dict]) -> tuple[list[dict], list[DecodedImage]]:
    """The messages as the chat template takes them (each image part a bare ``{"type": "image"}``)
    and their images in the order the template meets them. Messages without images are kept."""
    images: list[DecodedImage] = []
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_image(p) for p in content):
            out.append(message)
            continue
        parts = []
        for part in content:
            if _is_image(part):
                images.append(part["image"])
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, images


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image" and isinstance(part.get("image"), DecodedImage)
