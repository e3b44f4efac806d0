"""Rows in KV groups for any family whose layers are written the usual mlx-lm way: the model's own
forward pass runs over the batch, and each attention module runs group by group.

``row_groups.py`` writes out the whole pass for the plain pre-norm decoders, where a prompt's chunk
can ride along. Every other family keeps its own forward (sliding windows, latent attention,
experts, sinks, recurrent layers beside attention), with the grouped caches in it: a model builds
a mask from a layer's cache (``GroupedKV.make_mask``: one part per group) and hands it with each
layer's cache to the layer's attention module, whose class here is its own with one more step
in front: given a ``GroupedKV``, it runs once per group on that group's rows, mask and cache, and
the rows come back together. Projections of attention then read their weights once per group;
the feed-forward, the experts, the recurrent layers and the output head still run once over
every row, which is where most of a step's weights are.

A family fits when each of its cached layers has an attention module by a known name that takes
``(x, mask, cache)`` and the model has one layer per cache (Gemma 4's layers that share an
earlier layer's KV do not: they are left to mlx-lm's single array). Nothing of a module changes
but its class, which adds that step: a call without grouped caches is the module's own.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .layout import CacheLayout
from .row_groups import GroupedKV, GroupedMask

ATTENTION_NAMES = ("self_attn", "attention", "attn", "mixer")  # where mlx-lm's layers keep theirs
_CLASSES: dict[type, type] = {}


def wrap_attention(model: Any, layout: CacheLayout) -> bool:
    """Give every attention module of ``model`` the grouped step; False (and nothing changed) when
    the model does not fit (see the module's docstring)."""
    layers = getattr(model, "layers", None)
    if not layers or len(layers) != len(layout.layers) or not layout.layers:
        return False
    if any(spec.kind == "other" for spec in layout.layers):
        return False
    found = []
    for layer, spec in zip(layers, layout.layers):
        if spec.kind not in ("attention", "window"):
            continue
        module = next((getattr(layer, n) for n in ATTENTION_NAMES if callable(getattr(layer, n, None))), None)
        if module is None:
            return False
        found.append(module)
    if not found:
        return False
    for module in found:
        module.__class__ = grouped_class(type(module))
    return True


def grouped_class(cls: type) -> type:
    """``cls`` with the grouped step in front of its ``__call__`` (made once a class)."""
    if getattr(cls, "_row_groups", False):
        return cls
    made = _CLASSES.get(cls)
    if made is None:
        own = cls.__call__

        def __call__(self: Any, x: mx.array, mask: Any = None, cache: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(cache, GroupedKV):
                return own(self, x, mask, cache, *args, **kwargs)
            masks = mask.parts if isinstance(mask, GroupedMask) else [mask] * len(cache.groups)
            outs = [
                own(self, x[a:b], part, group, *args, **kwargs)
                for (a, b), group, part in zip(cache.spans(), cache.groups, masks)
            ]
            return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)

        made = type(cls.__name__, (cls,), {"__call__": __call__, "_row_groups": True, "__module__": cls.__module__})
        _CLASSES[cls] = made
    return made
