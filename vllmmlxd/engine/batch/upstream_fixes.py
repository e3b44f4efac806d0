"""mlx-lm bugs the engine carries a fix for, each named, applied once when the engine loads, and
pinned by a test that fails once the installed mlx-lm no longer has the bug (then the fix goes).

**nemotron_h_ssm_lengths** (mlx-lm 0.32.2, ``models/nemotron_h.py``): the Mamba-2 mixer of
Nemotron-H calls ``ssm_update`` without ``lengths=cache.lengths``, which every other Mamba-2
family of mlx-lm passes. When prompts of unequal length are prefilled together, a shorter one
is right-padded and its state is then read after the padding, not after its last token: its
answer changes with what it was batched with. The fix hands the cache's lengths to the call:
the mixer's ``_ssm`` notes them, and the module's ``ssm_update`` (the name ``_ssm`` calls) takes
them when none are given.

**batch_rotating_mask_after_rotation** (mlx-lm 0.32.2, ``models/cache.py``): a batch's sliding
window (``BatchRotatingKVCache``) that took a one-token step (written in place, the buffer
rotated) and then takes several tokens at once (a prompt chunk after a one-token chunk, rows
joined from the prefix cache) computes its mask before it puts the buffer back in time order,
so the mask counts the oldest kept position of a row shorter than the window as padding: that
row stops seeing a token it must see. The fix puts the buffer in time order before a
multi-token mask, as the update that follows does anyway (the update then finds it in order).

Nothing of mlx-lm's code is replaced: each fix wraps what mlx-lm ships and keeps it as
``__wrapped__``.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

_applied: set[str] = set()
_lock = threading.Lock()


def apply_all() -> None:
    """Apply every carried fix (idempotent; a family mlx-lm no longer ships is skipped)."""
    with _lock:
        for name, fix in FIXES.items():
            if name not in _applied:
                fix()
                _applied.add(name)


def _nemotron_h_ssm_lengths() -> None:
    try:
        module = importlib.import_module("mlx_lm.models.nemotron_h")
    except ImportError:
        return
    mixer = module.NemotronHMamba2Mixer
    original_ssm: Callable[..., Any] = mixer._ssm
    original_update: Callable[..., Any] = getattr(module, "ssm_update")  # noqa: B009 - untyped upstream module
    noted = threading.local()  # one engine thread a model, but tests run several

    def _ssm(self: Any, hidden_states: Any, B: Any, C: Any, dt: Any, cache: Any, mask: Any) -> Any:
        noted.lengths = getattr(cache, "lengths", None) if cache is not None else None
        try:
            return original_ssm(self, hidden_states, B, C, dt, cache, mask)
        finally:
            noted.lengths = None

    def ssm_update(*args: Any, **kwargs: Any) -> Any:
        if len(args) < 11 and kwargs.get("lengths") is None:  # lengths is ssm_update's 11th parameter
            kwargs["lengths"] = getattr(noted, "lengths", None)
        return original_update(*args, **kwargs)

    _ssm.__wrapped__ = original_ssm  # type: ignore[attr-defined]
    ssm_update.__wrapped__ = original_update  # type: ignore[attr-defined]
    setattr(mixer, "_ssm", _ssm)  # noqa: B010 - replacing a method: the carried fix itself
    setattr(module, "ssm_update", ssm_update)  # noqa: B010 - an untyped upstream module


def _batch_rotating_mask_after_rotation() -> None:
    from mlx_lm.models.cache import BatchRotatingKVCache

    original: Callable[..., Any] = BatchRotatingKVCache.make_mask

    def make_mask(self: Any, N: int, *args: Any, **kwargs: Any) -> Any:
        if N > 1 and self.rotated:
            self._temporal_order()  # what update_and_fetch does first for N > 1
        return original(self, N, *args, **kwargs)

    make_mask.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(BatchRotatingKVCache, "make_mask", make_mask)  # noqa: B010 - replacing a method: the carried fix itself


FIXES: dict[str, Callable[[], None]] = {
    "nemotron_h_ssm_lengths": _nemotron_h_ssm_lengths,
    "batch_rotating_mask_after_rotation": _batch_rotating_mask_after_rotation,
}
# What each fix wraps: (module, owner's dotted name or "", attribute).
WRAPPED: dict[str, list[tuple[str, str, str]]] = {
    "nemotron_h_ssm_lengths": [
        ("mlx_lm.models.nemotron_h", "NemotronHMamba2Mixer", "_ssm"),
        ("mlx_lm.models.nemotron_h", "", "ssm_update"),
    ],
    "batch_rotating_mask_after_rotation": [("mlx_lm.models.cache", "BatchRotatingKVCache", "make_mask")],
}


def unapplied(name: str) -> Any:
    """The mlx-lm objects a fix wraps, as mlx-lm ships them (for the test that tells when upstream
    fixed the bug): a context manager that takes the fix off while it runs."""
    return _Unapplied(name)


class _Unapplied:
    def __init__(self, name: str):
        self.name = name
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> None:
        for module_name, owner_name, attr in WRAPPED[self.name]:
            module = importlib.import_module(module_name)
            owner = getattr(module, owner_name) if owner_name else module
            current = getattr(owner, attr)
            self.saved.append((owner, attr, current))
            setattr(owner, attr, getattr(current, "__wrapped__", current))

    def __exit__(self, *exc: Any) -> None:
        for owner, attr, value in self.saved:
            setattr(owner, attr, value)
