"""What a model's layers keep between tokens, read once from its own cache objects: the engine's
features branch on this value, never on a list of family names.

mlx-lm gives each layer one cache object: ``KVCache`` (attention over every earlier token),
``RotatingKVCache`` (a sliding window: the last ``max_size`` tokens), ``ArraysCache`` (a
recurrent state: Mamba, gated delta, short convolutions; the same size at any length), or
kinds this engine treats as opaque (chunked attention, quantized KV, several caches in one
layer). From those, and from the attention modules (multi-head latent attention computes a
one-token pass and a multi-token pass differently), follow what the engine may do with the
model: cut its KV into prefix-cache blocks, checkpoint its recurrent state, rewind a rejected
draft. No mlx-lm private attribute is read here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

LayerKind = Literal["attention", "window", "state", "other"]
PrefixCacheKind = Literal["blocks", "blocks+windows", "blocks+checkpoints", "sequences"]
RollbackKind = Literal["trim", "replay"]


@dataclass(frozen=True)
class LayerCache:
    """One cache of the model's prompt cache: its kind, a window's size and the tokens it always
    keeps (``keep``), a recurrent state's number of arrays."""

    kind: LayerKind
    window: int | None = None
    keep: int = 0
    arrays: int = 0
    name: str = ""  # the cache's class, for what /v1/status shows of an opaque one


@dataclass(frozen=True)
class CacheLayout:
    """The model's layers as the engine sees them (``read_layout``)."""

    family: str  # the config's model_type
    layers: tuple[LayerCache, ...]
    latent: bool = False  # multi-head latent attention (DeepSeek-V3, Kimi, GLM-4.7-Flash...)
    dtype: str = "float32"  # the KV's dtype: the activations' precision
    # How far (nats, at most) a multi-token pass's log-probabilities are from one-token steps' over the
    # same positions, measured at load (``verify_drift``); None: not measured (a sharded model).
    drift: float | None = None

    def indices(self, kind: LayerKind) -> tuple[int, ...]:
        return tuple(i for i, layer in enumerate(self.layers) if layer.kind == kind)

    @property
    def windows(self) -> tuple[int, ...]:
        return self.indices("window")

    @property
    def states(self) -> tuple[int, ...]:
        return self.indices("state")

    @property
    def plain(self) -> bool:
        """Attention KV in every layer: what can be trimmed, cut anywhere, grouped by rows."""
        return bool(self.layers) and all(layer.kind == "attention" for layer in self.layers)

    @property
    def widest_window(self) -> int:
        return max((self.layers[i].window or 0) for i in self.windows) if self.windows else 0

    def prefix_cache(self, block_tokens: int) -> PrefixCacheKind:
        """How the prefix cache holds this model's sequences: attention KV in blocks; with sliding
        windows, each block also holds its windowed layers' KV (a window of at least a block, so
        every block is seen whole while it is in the window); with recurrent layers, their state
        is checkpointed at block ends. Anything else is stored whole, one sequence an entry."""
        kinds = {layer.kind for layer in self.layers}
        if not self.layers or "other" in kinds:
            return "sequences"
        if any((self.layers[i].window or 0) <= block_tokens for i in self.windows):
            return "sequences"
        if "state" in kinds:
            return "blocks+checkpoints"
        return "blocks+windows" if "window" in kinds else "blocks"

    @property
    def rollback(self) -> RollbackKind | None:
        """How a rejected draft is undone: attention KV is trimmed; sliding windows and recurrent
        states are put back as they were before the verify pass and the kept tokens fed again
        (``speculation/rollback.py``); an opaque cache cannot be. None: it cannot."""
        kinds = {layer.kind for layer in self.layers}
        if not kinds or "other" in kinds:
            return None
        return "trim" if kinds == {"attention"} else "replay"

    def speculation(self) -> str | None:
        """Why speculative decoding is off for this model, or None when it may speculate: an opaque
        cache cannot undo a rejected draft; and a model whose multi-token verify pass departs from
        its one-token steps (measured at load: latent attention in half precision does, by a median
        0.24 nats in bfloat16) would change its greedy output."""
        if self.rollback is None:
            opaque = sorted({layer.name for layer in self.layers if layer.kind == "other"})
            return f"its opaque layers ({', '.join(opaque) or 'none read'}) cannot undo a rejected draft"
        if self.drift is not None and self.drift > DRIFT_LIMIT:
            return (
                f"its multi-token verify pass departs from its one-token steps ({self.drift:.2f} nats at most, "
                f"measured at load in {self.dtype})"
            )
        return None

    def describe(self) -> dict:
        """The ``layout`` block of /v1/status."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return {
            "family": self.family,
            "layers": counts,
            "windows": sorted({self.layers[i].window for i in self.windows if self.layers[i].window}),
            "latent_attention": self.latent,
            "dtype": self.dtype,
            "verify_drift": None if self.drift is None else round(self.drift, 4),
            "rollback": self.rollback,
            "opaque": sorted({layer.name for layer in self.layers if layer.kind == "other"}),
        }


def read_layout(model: Any, *, probe: bool = True) -> CacheLayout:
    """``model``'s layout, from a fresh prompt cache and one token's graph (never evaluated: MLX
    knows the KV's dtype before it computes anything, and a sharded model's collectives never run);
    ``probe``: and, for a model that could speculate, its ``verify_drift`` (a few passes, evaluated:
    not for a sharded model's rank alone)."""
    cache = make_prompt_cache(model)
    layers = tuple(_layer(c) for c in cache)
    dtype = "float32"
    try:
        model(mx.array([[0]]), cache=cache)
        keys = next((c.keys for c in cache if getattr(c, "keys", None) is not None), None)
        if keys is not None:
            dtype = _dtype_name(keys.dtype)
    except Exception:  # a model whose graph needs more than tokens: its dtype stays unknown
        dtype = "unknown"
    args = getattr(model, "args", None)
    family = str(getattr(args, "model_type", "") or type(model).__module__.rsplit(".", 1)[-1])
    layout = CacheLayout(family, layers, latent=_latent(model), dtype=dtype)
    if probe and layout.rollback is not None:
        with contextlib.suppress(Exception):  # a model whose passes need more than tokens: nothing measured
            layout = replace(layout, drift=verify_drift(model))
    return layout


DRIFT_LIMIT = 0.1  # nats: the one-token and multi-token passes of plain attention agree to ~0 in float32 and bfloat16
PROBE_TOKENS, PROBE_STEPS = 12, 6


def verify_drift(model: Any) -> float:
    """The largest difference (nats) between the log-probabilities a multi-token pass gives the last
    ``PROBE_STEPS`` positions of a fixed token sequence and those one-token steps give the same
    positions: a verifying pass must compute what decode steps do, or speculation changes answers."""
    vocab = int(getattr(getattr(model, "args", None), "vocab_size", 0) or 256)
    tokens = mx.random.randint(0, min(vocab, 1000), (1, PROBE_TOKENS), key=mx.random.key(0))
    start = PROBE_TOKENS - PROBE_STEPS
    whole = model(tokens, cache=make_prompt_cache(model))[0, start - 1 : PROBE_TOKENS - 1]
    cache = make_prompt_cache(model)
    steps = [model(tokens[:, :start], cache=cache)[0, -1]]
    steps += [model(tokens[:, i : i + 1], cache=cache)[0, -1] for i in range(start, PROBE_TOKENS - 1)]
    one, many = (_log_softmax(x) for x in (mx.stack(steps), whole))
    return cast(float, mx.abs(one - many).max().item())


def _log_softmax(logits: mx.array) -> mx.array:
    logits = logits.astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _layer(cache: Any) -> LayerCache:
    kind = type(cache)
    if kind is KVCache:
        return LayerCache("attention")
    if kind is RotatingKVCache:
        return LayerCache("window", window=int(cache.max_size), keep=int(cache.keep))
    if kind is ArraysCache:
        return LayerCache("state", arrays=len(cache.cache))
    return LayerCache("other", name=kind.__name__)


def _latent(model: Any) -> bool:
    """Whether an attention module keeps a compressed latent KV (multi-head latent attention)."""
    try:
        modules = model.named_modules()
    except AttributeError:
        return False
    for _, module in modules:
        name = type(module).__name__
        if name in ("MultiLinear", "QuantizedMultiLinear") or hasattr(module, "kv_lora_rank"):
            return True
    return False


def _dtype_name(dtype: Any) -> str:
    for name in ("float32", "float16", "bfloat16"):
        if getattr(mx, name) == dtype:
            return name
    return str(dtype)
