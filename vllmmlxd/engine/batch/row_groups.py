"""A batch whose rows keep their KV in groups, so a prompt joins without copying anyone's KV.

mlx-lm's ``BatchKVCache`` holds every row in one left-padded array: when a prefilled prompt
joins, ``extend`` pads both the running rows and the new one to the longest and concatenates
them (on a CPU, half a second for a 2,000-token prompt beside a short stream: every running
stream stalls that long), and from then on a short row attends over the long one's padding.
Here each layer's cache is a list of groups, each an ordinary ``BatchKVCache`` of some rows: a
joining batch becomes a group of its own, a finished row's group is dropped, and only a batch
with more than ``MAX_GROUPS`` groups merges two small neighbours (a cheap copy).

The forward pass still reads the weights once a step: every row goes through the projections,
the feed-forward block and the output head together; only attention runs group by group, each
with its own offsets and mask. That needs the layer written out, so it is done for the decoder
families whose layers are the plain pre-norm kind (llama, mistral, qwen2, qwen3). Other
families run their own forward pass over the grouped caches, each attention module group by
group (``grouped_attention.py``): the feed-forward, experts and head still read the weights once
for every row, but no prompt chunk rides along. A model neither covers keeps mlx-lm's single
array.

The same pass carries more that mlx-lm runs in passes of their own: a prompt's chunk being
prefilled rides along (``RidingPrompts``: its KV written, no logits), and a prompt that is done
joins priming (its last token fed in the batch's next pass, what comes back for it dropped).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache

from .mlxlm import counted, matchers, start_counters, written

MAX_GROUPS = 4  # attention runs once a group a layer: past this many, two small neighbours merge
FAMILIES = ("mlx_lm.models.llama", "mlx_lm.models.mistral", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads", "n_kv_heads", "scale")
BLOCK = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")


def groupable(model: Any) -> bool:
    """Whether ``model`` is a decoder this module can run group by group: one of ``FAMILIES``,
    every layer full attention of the plain pre-norm kind."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if type(model).__module__ not in FAMILIES or not layers or getattr(inner, "swa_idx", None) is not None:
        return False
    if not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm") or not hasattr(model, "args"):
        return False
    return all(
        all(hasattr(layer, a) for a in BLOCK) and all(hasattr(layer.self_attn, a) for a in ATTENTION)
        for layer in layers
    )


def rows_of(cache: BatchKVCache) -> int:
    return int(cache.offset.shape[0])


# The batched caches a layer's rows can be split into groups of (sliding windows too).
GROUPED_KINDS = (BatchKVCache, BatchRotatingKVCache)


@dataclass
class GroupedMask:
    """A grouped layer's mask: one per group (each group's rows have their own offsets and padding)."""

    parts: list[Any]


class GroupedKV:
    """One layer's KV for the batch: its rows, in order, split over ``groups``."""

    def __init__(self, groups: list[Any]):  # BatchKVCache, or a window's BatchRotatingKVCache
        self.groups = groups

    def spans(self) -> list[tuple[int, int]]:
        """Each group's rows as [start, end) of the batch."""
        out, start = [], 0
        for g in self.groups:
            out.append((start, start + rows_of(g)))
            start += rows_of(g)
        return out

    def extend(self, other: Any) -> None:
        self.groups.extend(other.groups if isinstance(other, GroupedKV) else [other])

    def filter(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` (in that order); a group none of whose rows stay is dropped
        without a copy, and one whose rows all stay is left as it is."""
        if any(b <= a for a, b in itertools.pairwise(keep)):  # not in batch order: one array, as mlx-lm would
            self.merge(0, len(self.groups))
            self.groups[0].filter(keep)
            return
        kept = []
        for g, (start, end) in zip(self.groups, self.spans()):
            local = [i - start for i in keep if start <= i < end]
            if not local:
                continue
            if len(local) < end - start:
                g.filter(local)
            kept.append(g)
        self.groups = kept

    def merge(self, first: int, stop: int) -> None:
        """Groups ``first`` to ``stop`` (exclusive) become one (mlx-lm's padded copy)."""
        merged = self.groups[first]
        for g in self.groups[first + 1 : stop]:
            merged.extend(g)
        self.groups[first:stop] = [merged]

    def make_mask(self, N: int, **kwargs: Any) -> GroupedMask:
        """Each group's own mask (a model builds one from a layer's cache and hands it to every
        layer of that kind: the attention modules take their group's part)."""
        return GroupedMask([g.make_mask(N, **kwargs) for g in self.groups])

    def locate(self, idx: int) -> tuple[BatchKVCache, int]:
        for g, (start, end) in zip(self.groups, self.spans()):
            if start <= idx < end:
                return g, idx - start
        raise IndexError(idx)

    def extract(self, idx: int) -> KVCache:
        """Row ``idx``'s KV as a cache of its own. A row alone in its group is a view of that
        group's buffer, not a copy: a finished row's group is dropped, so the view is all that
        holds it (a row that runs on copies the buffer at its next write, as mlx-lm's extract
        would have copied it now)."""
        g, local = self.locate(idx)
        if rows_of(g) > 1 or g.keys is None or type(g) is not BatchKVCache:
            return g.extract(local)
        start = int(g.left_padding[0].item())
        cache = KVCache()
        end = written(g)
        cache.keys = g.keys[..., start:end, :]
        cache.values = g.values[..., start:end, :]
        cache.offset = end - start
        return cache

    def prepare(self, *, lengths: list[int], right_padding: list[int]) -> None:
        """A right-padded pass over the batch (a speculating batch's replay): each group its rows' part."""
        for g, (start, end) in zip(self.groups, self.spans()):
            g.prepare(lengths=lengths[start:end], right_padding=right_padding[start:end])

    def finalize(self) -> None:
        for g in self.groups:
            g.finalize()

    def trim(self, n: int) -> int:
        return min(g.trim(n) for g in self.groups)

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return max((g.size() for g in self.groups), default=0)

    def empty(self) -> bool:
        return all(g.empty() for g in self.groups)

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def state(self) -> list[Any]:
        return [g.state for g in self.groups]


def row_groups(cache: Any) -> Iterator[tuple[BatchKVCache, slice]]:
    """Each ``BatchKVCache`` of one layer's cache with the batch rows it holds."""
    if isinstance(cache, GroupedKV):
        for g, (start, end) in zip(cache.groups, cache.spans()):
            yield g, slice(start, end)
    else:
        yield cache, slice(0, rows_of(cache))


@dataclass
class Segment:
    """Rows that attend to one cache: ``tokens`` (B, L) and that cache's layers."""

    tokens: mx.array
    cache: list[Any]  # a BatchKVCache a layer


class GroupedModel:
    """The model as the batch calls it: over grouped caches, attention group by group; and with
    a prompt's chunk riding along (``rider``), which the same pass prefills."""

    def __init__(self, model: Any, *, written: bool = True):
        self.model = model
        # False: the model's own forward runs over the grouped caches (grouped_attention.py).
        self.written = written
        self.rider: Segment | None = None  # a prompt chunk waiting for the batch's next pass
        self.rode = 0  # prompt tokens the passes since the scheduler last looked carried along

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> mx.array:
        rider = self.rider
        if not self.written or not cache or kwargs or (rider is not None and cache is rider.cache):
            return self.model(inputs, cache=cache, **kwargs)
        grouped = isinstance(cache[0], GroupedKV)
        if rider is None and not grouped:
            return self.model(inputs, cache=cache)
        if rider is None and len(cache[0].groups) == 1:
            return self.model(inputs, cache=[c.groups[0] for c in cache])
        self.rider = None
        if rider is not None:
            self.rode += rider.tokens.size
        groups = (
            [Segment(inputs[a:b], [c.groups[i] for c in cache]) for i, (a, b) in enumerate(cache[0].spans())]
            if grouped
            else [Segment(inputs, cache)]
        )
        return grouped_forward(self.model, groups, rider)


def grouped_forward(model: Any, segments: list[Segment], rider: Segment | None = None) -> mx.array:
    """The logits of the segments' rows (in order), each segment attending to its own KV; a
    ``rider`` goes through the same pass (its KV written, no logits)."""
    inner = model.model
    parts = [*segments, rider] if rider is not None else segments
    hs = [inner.embed_tokens(p.tokens) for p in parts]
    # Masks are read before any layer writes: the same for every layer.
    masks = [create_attention_mask(h, p.cache[0]) for h, p in zip(hs, parts)]
    shapes = [h.shape[:2] for h in hs]
    h = mx.concatenate([x.reshape(-1, x.shape[-1]) for x in hs]) if len(hs) > 1 else hs[0].reshape(-1, hs[0].shape[-1])
    for index, layer in enumerate(inner.layers):
        caches = [p.cache[index] for p in parts]
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), shapes, caches, masks)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    rows = sum(b * n for b, n in shapes[: len(segments)])
    length = shapes[0][1]  # every segment's rows are as long: they are the batch's
    out = inner.norm(h[:rows].reshape(rows // length, length, -1))
    if getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return inner.embed_tokens.as_linear(out)
    return model.lm_head(out)


def _attention(
    attn: Any, x: mx.array, shapes: list[tuple[int, int]], caches: list[BatchKVCache], masks: list[Any]
) -> mx.array:
    """One layer's attention over the flattened rows ``x``: projections together, the rest a
    segment at a time (``shapes``: each segment's (rows, length))."""
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    outs, start = [], 0
    for (B, L), cache, mask in zip(shapes, caches, masks):
        end = start + B * L
        q = queries[start:end].reshape(B, L, attn.n_heads, -1)
        k = keys[start:end].reshape(B, L, attn.n_kv_heads, -1)
        if hasattr(attn, "q_norm"):  # qwen3 normalises each head
            q, k = attn.q_norm(q), attn.k_norm(k)
        v = values[start:end].reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = attn.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)
        k, v = cache.update_and_fetch(attn.rope(k.transpose(0, 2, 1, 3), offset=cache.offset), v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=mask)
        outs.append(out.transpose(0, 2, 1, 3).reshape(B * L, -1))
        start = end
    return attn.o_proj(mx.concatenate(outs) if len(outs) > 1 else outs[0])


class GroupedBatch(GenerationBatch):
    """mlx-lm's generation batch, whose rows joining later keep their KV apart (``GroupedKV``)."""

    grouping: bool = False  # set by the scheduler: the model is ``groupable`` and wrapped in ``GroupedModel``
    priming: bool = False  # a joining batch whose rows' first pass is the batch's next one
    primed: frozenset[int] = frozenset()  # rows (uids) that joined priming: their first pass is the next step

    def extend(self, batch: Any) -> None:
        if getattr(batch, "priming", False):
            self.primed = self.primed | set(batch.uids)
        joins = bool(self.prompt_cache) and bool(batch.prompt_cache)
        # Layers of attention KV (or a window) keep the joining rows apart; a recurrent state is
        # the same size at any length, and joins by mlx-lm's own concatenation.
        grouped = (
            self.grouping
            and joins
            and len(self.prompt_cache) == len(batch.prompt_cache)
            and any(isinstance(c, (*GROUPED_KINDS, GroupedKV)) for c in self.prompt_cache)
            and all(
                isinstance(mine, (*GROUPED_KINDS, GroupedKV)) == isinstance(theirs, GROUPED_KINDS)
                for mine, theirs in zip(self.prompt_cache, batch.prompt_cache)
            )
        )
        if grouped:
            self.prompt_cache = [GroupedKV([c]) if isinstance(c, GROUPED_KINDS) else c for c in self.prompt_cache]
        super().extend(batch)
        if grouped:
            layers = [c for c in self.prompt_cache if isinstance(c, GroupedKV)]
            while len(layers[0].groups) > MAX_GROUPS:
                first = _cheapest_merge(layers[0].groups)
                for c in layers:
                    c.merge(first, first + 2)

    def next(self) -> list[Any]:
        """A step; rows that joined priming get their first pass in it, and what comes back for
        them (their last prompt token, fed as their input) is no answer token: it is dropped,
        and their counts and stop matchers are as if the step had not been."""
        primed = self.primed
        if not primed:
            return super().next()
        self.primed = frozenset()
        rows = [i for i, uid in enumerate(self.uids) if uid in primed]
        stops, counts = matchers(self), counted(self)
        saved = {self.uids[i]: stops[i] for i in rows}
        for i in rows:  # none of them can finish on a prompt token
            self.max_tokens[i] += 1
            stops[i] = cast(Any, _NEVER_STOPS)
        responses = super().next()
        stops, counts = matchers(self), counted(self)
        for i, uid in enumerate(self.uids):
            if uid in saved:
                self.max_tokens[i] -= 1
                counts[i] -= 1
                stops[i] = saved[uid]
        return [r for r in responses if r.uid not in primed]


class _NeverStops:
    """A stop matcher that matches nothing (a priming row's prompt token is not an answer)."""

    def advance(self, token: int) -> bool:
        return False


_NEVER_STOPS = _NeverStops()


def _cheapest_merge(groups: list[BatchKVCache]) -> int:
    """The first of the two neighbouring groups whose merged array is smallest (rows x positions)."""
    cost = [(rows_of(a) + rows_of(b)) * max(a.size(), b.size()) for a, b in itertools.pairwise(groups)]
    return cost.index(min(cost))


def _never() -> bool:
    return False


class RidingPrompts(PromptProcessingBatch):
    """mlx-lm's batch of prompts being prefilled, whose chunk rides on the running batch's next
    pass when there is one: the chunk and the decode step read the weights once between them,
    where two passes read them twice (a 4-token chunk beside one stream cost 2.5 decode steps).
    The chunk is handed over (``GroupedModel.rider``) and runs at the start of the next step;
    anything that reads or changes these prompts' KV before then runs it first, alone."""

    decoding: Callable[[], bool] = staticmethod(_never)  # set by the scheduler: whether a batch runs
    deferred = 0  # prompt tokens handed to the next pass since the scheduler last looked

    def prompt(self, tokens: list[list[int]]) -> None:
        self.flush()
        model = self.model
        lengths = {len(t) for t in tokens}
        if not (
            isinstance(model, GroupedModel) and tokens and len(lengths) == 1 and 0 not in lengths and self.decoding()
        ):
            super().prompt(tokens)
            return
        for held, new in zip(self.tokens, tokens):
            held += new  # what the KV holds once the chunk has run, as mlx-lm keeps it
        model.rider = Segment(mx.array(tokens), self.prompt_cache)
        self.deferred += sum(len(t) for t in tokens)

    def flush(self) -> None:
        """Run a chunk still waiting for a pass, alone."""
        model = self.model
        rider = model.rider if isinstance(model, GroupedModel) else None
        if rider is not None and rider.cache is self.prompt_cache:
            model.rider = None
            model.model(rider.tokens, cache=rider.cache)
            mx.eval([c.state for c in rider.cache])

    def extend(self, batch: Any) -> None:
        self.flush()
        super().extend(batch)

    def split(self, indices: list[int]) -> Any:
        self.flush()
        if sorted(indices) != list(range(len(self.uids))):
            return super().split(indices)
        # Every prompt is done: the batch moves over whole, its KV uncopied (mlx-lm copies it all
        # and filters both halves: for a long prompt a copy of its whole KV in the joining step).
        moved = copy.copy(self)
        self._handed_over()
        return moved

    def filter(self, keep: list[int]) -> None:
        self.flush()
        super().filter(keep)

    def extract_cache(self, idx: int) -> list[Any]:
        self.flush()
        return super().extract_cache(idx)

    def generate(self, tokens: list[list[int]]) -> Any:
        self.flush()
        if self.decoding() and isinstance(self.model, GroupedModel) and all(len(t) == 1 for t in tokens):
            return self._priming([t[0] for t in tokens])
        riding, self.decoding = self.decoding, _never  # the new batch's first pass reads this KV now
        try:
            return super().generate(tokens)
        finally:
            self.decoding = riding

    def _priming(self, last: list[int]) -> GroupedBatch:
        """These prompts as a generation batch whose first pass has not run: it joins the running
        batch and runs in its next pass (mlx-lm runs a pass of its own for it, here: a second
        read of the weights in the joining step). The row is fed its last prompt token then."""
        batch = GroupedBatch.__new__(GroupedBatch)
        GenerationBatch.__init__(
            batch, self.model, [], mx.array(last), self.prompt_cache, self.tokens, None,
            self.fallback_sampler, None, self.stop_sequences, self.max_tokens,
        )  # fmt: skip
        batch.uids, batch.samplers, batch.logits_processors = self.uids, self.samplers, self.logits_processors
        start_counters(batch, len(self.uids), mx.zeros((0,)))  # the prompt token comes back with nothing
        batch.priming = True
        self._handed_over()
        return batch

    def _handed_over(self) -> None:
        """Its prompts (and their KV) now belong to another batch: this one holds none."""
        self.uids, self.prompt_cache, self.tokens, self.samplers = [], [], [], []
        self.logits_processors, self.max_tokens, self.stop_sequences = [], [], []
