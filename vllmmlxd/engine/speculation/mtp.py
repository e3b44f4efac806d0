"""Multi-token-prediction drafts: the layers a checkpoint ships to predict the token after next.

Qwen3.5/3.6 checkpoints (and Qwen3-Next's) carry one more decoder layer under ``mtp.*``, trained
to predict token ``t+2`` from the main model's last hidden state at ``t`` and the embedding of
token ``t+1``: the embedding and the hidden state, each normalized, concatenated, projected
(``fc``), one full-attention decoder layer of the model's own kind, a norm, and the model's own
output head. mlx-lm drops these weights at load (its ``sanitize``); this module reads them from
the checkpoint's files and drafts with them inside the continuous batch, row by row, as a draft
model does: greedy, so a draft is certain, and verified like any other (outputs identical).

What the layer needs, the batch's passes already compute: the main model's hidden state at each
position it fed. The batch calls the model through ``HiddenTap``, which runs its body and head
apart and keeps the hidden states of the last pass. Each row keeps its own small KV cache of the
MTP layer over the pairs (hidden state at ``j-1``, token at ``j``) of the positions it has
decoded: after a step, the pairs of the tokens it kept are its next drafting's first input, fed
in one pass, and the drafts that chain from them (the layer's own output standing in for the
hidden state it has not seen) are cut from its cache once proposed. Its attention starts at the
row's first decoded token (the prompt's hidden states are not kept): positions differ from the
model's by a constant, which rotary embeddings do not see. DeepSeek-V3's and GLM-4.5's MTP
modules have their own shapes; their checkpoints are served without MTP drafts (``mtp_parts``).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ...errors import ModelLoadError

PREFIX = "mtp."
# The families whose MTP layer is this shape (their config's ``model_type``). Qwen3-Next's is too,
# but mlx-lm 0.32 cannot load a converted Qwen3-Next checkpoint that keeps ``mtp.*`` (its sanitize
# drops them only while converting), and its sanitize shifts an unconverted layer's norms itself:
# not read until tested.
FAMILIES = ("qwen3_5", "qwen3_5_moe")
# A checkpoint not converted by mlx-lm keeps these norms zero-centred (weight + 1 is the scale), as
# the model's own sanitize knows for its other layers.
CENTRED_NORMS = re.compile(r"(input_layernorm|post_attention_layernorm|q_norm|k_norm|pre_fc_norm_\w+|^norm)\.weight$")


@dataclass(frozen=True)
class Parts:
    """What the MTP layer shares with the model: its body (embedding and layers, to the final
    norm), its output head, its embedding, its text arguments and its decoder layer class."""

    body: Any
    head: Any
    embed: Any
    args: Any
    layer: type


def mtp_parts(model: Any) -> Parts | None:
    """``model``'s parts, where its family's MTP layer is the one this module builds."""
    text = getattr(model, "language_model", model)
    args = getattr(text, "args", None)
    body = getattr(text, "model", None)
    family = str(getattr(getattr(model, "args", None), "model_type", ""))
    if family not in FAMILIES or body is None or args is None or not hasattr(body, "embed_tokens"):
        return None
    head = getattr(text, "lm_head", None) or body.embed_tokens.as_linear
    return Parts(body, head, body.embed_tokens, args, type(body.layers[0]))


class MTPLayers(nn.Module):
    """The checkpoint's ``mtp.*`` module, its names as the checkpoint's."""

    def __init__(self, args: Any, layer: type, count: int = 1):
        super().__init__()
        size, eps = args.hidden_size, args.rms_norm_eps
        self.fc = nn.Linear(2 * size, size, bias=False)
        # A full-attention layer of the model's own kind (its index picks attention over recurrence).
        self.layers = [layer(args, layer_idx=args.full_attention_interval - 1) for _ in range(count)]
        self.norm = nn.RMSNorm(size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(size, eps=eps)
        self.pre_fc_norm_embedding = nn.RMSNorm(size, eps=eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: KVCache) -> mx.array:
        x = mx.concatenate([self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1)
        x = self.fc(x)
        mask = create_attention_mask(x, None)
        for layer in self.layers:
            x = layer(x, mask=mask, cache=cache)
        return self.norm(x)


class HiddenTap:
    """The model as a speculating batch calls it: its body, then its head, the body's hidden
    states of the last pass kept (``hidden``: rows, positions, width)."""

    def __init__(self, model: Any, parts: Parts):
        self.model, self.parts = model, parts
        self.hidden: mx.array | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> mx.array:
        hidden = self.parts.body(inputs, cache=cache)
        self.hidden = hidden
        return self.parts.head(hidden)


@dataclass
class MTPRow:
    """One row's MTP state: its cache over the pairs fed so far, the pairs not fed yet, the hidden
    state at its last fed position (the pending token's pair), and whether this step's drafting
    fed that pair already."""

    cache: KVCache = field(default_factory=KVCache)
    unfed: list[tuple[mx.array, int]] = field(default_factory=list)
    last: mx.array | None = None
    proposed: bool = False


class MTPDrafter:
    """Drafts each row's next tokens with the checkpoint's MTP layer (``SpeculativeBatch.drafter``)."""

    def __init__(self, layers: MTPLayers, parts: Parts):
        self.layers, self.parts = layers, parts

    def tap(self, model: Any) -> HiddenTap:
        return HiddenTap(model, self.parts)

    # As a model of one layer (``make_cache``, a pass over tokens), for the KV budget's probe of
    # what a row holds beside the model's own KV (kv_probe.probe_layout).
    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def __call__(self, inputs: mx.array, cache: list[KVCache]) -> mx.array:
        embeddings = self.parts.embed(inputs)
        return self.layers(embeddings, mx.zeros_like(embeddings), cache[0])

    def propose(self, row: Any, history: Any, k: int) -> list[int]:
        """``k`` drafts after the pending token (``history``'s last), greedy."""
        state: MTPRow | None = row.mtp
        if state is None or state.last is None:
            return []  # a row's first step after its prompt: its hidden state comes with that pass
        pairs = [*state.unfed, (state.last, int(history[-1]))]
        hidden = mx.stack([h for h, _ in pairs])[None]
        tokens = mx.array([[t for _, t in pairs]])
        out = self.layers(self.parts.embed(tokens), hidden, state.cache)[:, -1:]
        state.unfed, state.proposed = [], True
        chain = []
        for j in range(k):  # one graph, evaluated once: no wait on the host between drafts
            token = mx.argmax(self.parts.head(out)[:, -1], axis=-1)
            chain.append(token)
            if j + 1 < k:  # the layer's own output stands for the hidden state it has not seen
                out = self.layers(self.parts.embed(token[None]), out, state.cache)
        drafts = cast(list[int], mx.concatenate(chain).tolist())
        if k > 1:
            state.cache.trim(k - 1)  # chained guesses: the kept tokens' true pairs come next step
        return drafts

    def rewind(self, row: Any, history_len: int) -> None:
        """Nothing to undo: a proposal keeps only true pairs in the row's cache."""

    def observe(self, row: Any, emitted: list[int], hidden: mx.array) -> None:
        """A pass fed ``emitted[0]`` (the pending token) and the drafts after it, and the row kept
        ``emitted``; ``hidden``: the row's hidden states at those positions."""
        if row.mtp is None:
            row.mtp = MTPRow()
        state: MTPRow = row.mtp
        if not state.proposed and state.last is not None:
            state.unfed.append((state.last, emitted[0]))
        state.unfed.extend((hidden[j - 1], emitted[j]) for j in range(1, len(emitted)))
        state.last, state.proposed = hidden[len(emitted) - 1], False


# -- loading ----------------------------------------------------------------------------------


def load_mtp(path: Path, model: Any) -> MTPDrafter | None:
    """The checkpoint's MTP layers as a drafter; None when ``model``'s family has none of this
    shape or the checkpoint carries none (mlx-lm's conversions drop them)."""
    parts = mtp_parts(model)
    if parts is None:
        return None
    files = [f for f in sorted(path.glob("*.safetensors")) if any(PREFIX in k for k in _names(f))]
    if not files:
        return None
    weights: dict[str, mx.array] = {}
    converted = True
    for f in files:
        loaded, meta = cast(tuple[dict[str, mx.array], dict[str, str]], mx.load(str(f), return_metadata=True))
        converted = converted and meta.get("format") == "mlx"
        weights.update({k[k.index(PREFIX) + len(PREFIX) :]: v for k, v in loaded.items() if PREFIX in k})
    if not converted:  # the checkpoint's own convention: centred norms, experts one by one
        weights = _as_converted(weights, model, parts)
    count = 1 + max((int(m.group(1)) for k in weights if (m := re.match(r"layers\.(\d+)\.", k))), default=0)
    layers = MTPLayers(parts.args, parts.layer, count)
    quantization = json.loads((path / "config.json").read_text()).get("quantization")
    if quantization and any(k.endswith(".scales") for k in weights):
        nn.quantize(
            layers,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            class_predicate=lambda p, _: f"{p}.scales" in weights,
        )
    layers.load_weights(list(weights.items()), strict=True)
    layers.eval()
    mx.eval(layers.parameters())
    return MTPDrafter(layers, parts)


def required_mtp(path: Path, model: Any, name: str) -> MTPDrafter:
    """``load_mtp``, for an entry that asked for MTP drafts: a checkpoint without them is an error."""
    drafter = load_mtp(path, model)
    if drafter is None:
        raise ModelLoadError(
            f"speculative method mtp: {name!r} carries no multi-token-prediction layers this engine "
            f"reads (mtp.* weights of a {', '.join(FAMILIES)} checkpoint; mlx-lm's conversions drop them): "
            "serve the original checkpoint, or use method prompt-lookup"
        )
    return drafter


def _as_converted(weights: dict[str, mx.array], model: Any, parts: Parts) -> dict[str, mx.array]:
    """An unconverted checkpoint's MTP weights as mlx-lm converts the model's own: the model's
    sanitize, given the layer's weights under one of its own full-attention layers' names (it
    stacks experts), and the centred norms shifted as it shifts the others'."""
    index = parts.args.full_attention_interval - 1
    own = f"language_model.model.layers.{index}."
    layer = {own + k[len("layers.0.") :]: v for k, v in weights.items() if k.startswith("layers.0.")}
    rest = {k: v for k, v in weights.items() if not k.startswith("layers.")}
    sanitized = model.sanitize(dict(layer)) if hasattr(model, "sanitize") else layer
    out = {"layers.0." + k[len(own) :]: v for k, v in sanitized.items() if k.startswith(own)}
    out.update(rest)
    return {k: (v + 1.0 if v.ndim == 1 and CENTRED_NORMS.search(k) else v) for k, v in out.items()}


def _names(file: Path) -> list[str]:
    """A safetensors file's tensor names, from its header (the tensors are not read)."""
    with file.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return [k for k in header if k != "__metadata__"]
