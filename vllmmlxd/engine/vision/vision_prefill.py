"""Prompts whose uncached part holds images: prefilled from embeddings before they join the batch.

mlx-lm's ``BatchGenerator`` prefills token ids; at an image's positions the model must see the
vision tower's features instead. So such a prompt is prefilled here, from where the prefix cache
left it to the end of its last image, into a KV cache of its own, a chunk per scheduler step
(running streams keep decoding between chunks); then it joins the batch as an ordinary prompt
whose start is cached, and the batch prefills the text after its last image and decodes it with
everyone else. A prompt whose images the prefix cache already covers never comes here: the vision
tower does not run for it.

The tower runs an image whole (mlx-vlm's call takes all its tiles), which can take seconds on a
CPU: a step that runs it does nothing else for that prompt, and a step runs it for one image at
most, so streams decoding beside several new images pay one image's tower per step, not all.

Runs on the engine thread (mlx).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..types import ImageSpan

if TYPE_CHECKING:
    from ..step.sequence import Sequence

KEPT_FEATURES = 8  # images whose features are kept: the same picture in another conversation skips the tower


@dataclass
class Staged:
    """A prompt being prefilled from embeddings: positions ``pos .. end`` are left."""

    seq: Sequence
    cache: list[Any]  # per-layer KV, holding positions ``0 .. pos``
    pos: int
    end: int  # the end of its last image: the batch takes over from here
    features: dict[str, mx.array] = field(default_factory=dict)  # its images' embeddings, held until it joins


class EmbeddingPrefill:
    """The decoder fed embeddings, and the vision tower that makes an image's."""

    def __init__(self, model: Any, vision_model: Any):
        self.model = model  # the engine's decoder (an mlx-lm model taking ``input_embeddings``)
        self.vision_model = vision_model  # mlx-vlm's model: ``get_input_embeddings`` and its embed_tokens
        self._features: OrderedDict[str, mx.array] = OrderedDict()

    def needed(self, seq: Sequence, cached: int) -> bool:
        """Whether ``seq``'s prompt, cached up to ``cached``, still has an image to prefill."""
        return any(span.end > cached for span in seq.request.images)

    def stage(self, seq: Sequence, cache: list[Any] | None, cached: int) -> Staged:
        """Start prefilling ``seq`` after its ``cached`` tokens (``cache``: the prefix cache's copy)."""
        end = min(max(span.end for span in seq.request.images), len(seq.prompt) - 1)
        return Staged(seq, cache if cache is not None else make_prompt_cache(self.model), cached, end)

    def advance(self, staged: Staged, budget: int, *, tower: bool) -> tuple[int, bool]:
        """Prefill up to ``budget`` more positions (at least one), or, when they reach an image
        whose features are not ready and ``tower`` allows it, run that image through the tower
        instead. Returns (positions prefilled, whether the tower ran)."""
        stop = min(staged.pos + max(budget, 1), staged.end)
        prompt = staged.seq.prompt
        for span in staged.seq.request.images:
            if span.end > staged.pos and span.start < stop and span.key not in staged.features:
                if span.key in self._features:
                    staged.features[span.key] = self._kept(span.key)
                    continue
                if tower:
                    staged.features[span.key] = self._image(span, prompt[span.start : span.end])
                return 0, tower
        embeddings = self._embeddings(staged, staged.pos, stop)
        self.model(None, cache=staged.cache, input_embeddings=embeddings[None])
        mx.eval([c.state for c in staged.cache])
        done = stop - staged.pos
        staged.pos = stop
        return done, False

    def _embeddings(self, staged: Staged, start: int, stop: int) -> mx.array:
        """The decoder's input at positions ``start .. stop``: token embeddings, and each image's
        features over its span."""
        seq = staged.seq
        prompt = seq.prompt
        pieces = []
        pos = start
        for span in sorted(seq.request.images, key=lambda s: s.start):
            if span.end <= pos or span.start >= stop:
                continue
            if span.start > pos:
                pieces.append(self._tokens(prompt[pos : span.start]))
                pos = span.start
            upto = min(span.end, stop)
            pieces.append(staged.features[span.key][pos - span.start : upto - span.start])
            pos = upto
        if pos < stop:
            pieces.append(self._tokens(prompt[pos:stop]))
        return mx.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]

    def _tokens(self, ids: list[int]) -> mx.array:
        return self.vision_model.language_model.embed_tokens(mx.array(ids))

    def _kept(self, key: str) -> mx.array:
        self._features.move_to_end(key)
        return self._features[key]

    def _image(self, span: ImageSpan, ids: list[int]) -> mx.array:
        """An image span's embeddings (its layout tokens' own, the tower's features at its image
        tokens), from mlx-vlm's model: the same call its own generation makes."""
        inputs = {name: mx.array(value) for name, value in span.inputs.items()}
        pixels = inputs.pop("pixel_values")
        out = self.vision_model.get_input_embeddings(mx.array(ids)[None], pixels, **inputs)
        features = out.inputs_embeds[0]
        mx.eval(features)
        self._features[span.key] = features
        while len(self._features) > KEPT_FEATURES:
            self._features.popitem(last=False)
        return features
