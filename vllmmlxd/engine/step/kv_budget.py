"""The KV budget of running requests: what a request's KV costs, and whether it may join the batch. Pure; no mlx.

A request reserves the KV of its whole length, prompt + ``max_tokens``, when it leaves the
queue, so nothing that runs can outgrow the budget later; one whose reservation does not fit
beside the running ones waits, and one that would not fit alone is refused before any work.

What a batch holds is counted as mlx-lm's batch holds it: ``BatchKVCache`` keeps its rows
aligned, each padded to the longest, so a batch costs ``rows x bytes_for(longest row)``, not
the sum of its rows. Each row is also counted with the cache's growth step (mlx-lm allocates KV
256 positions at a time) and, when the entry speculates, the draft positions a verify step
writes before it trims them.

A prefix-cache hit saves the prefill, not the memory: the request gets its own copy of the
cached start, so the reservation is the same with or without a hit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ..cache.checkpoints import checkpoint_count

MIB = 1 << 20
GROWTH_STEP = 256  # mlx-lm's KVCache and BatchKVCache allocate this many positions at a time
# The default budget leaves this share of usable memory (at least MARGIN_MIN) to what is not KV:
# a prefill chunk's activations, the copies a batch makes when a row joins or leaves, the allocator.
MARGIN_FRACTION = 0.10
MARGIN_MIN = 512 * MIB
WORKER_OVERHEAD = 200 * MIB  # the interpreter, FastAPI, mlx and the BLAS (as supervisor.memory counts a worker)
FLOOR = 64 * MIB  # a default never below this: a machine with nothing left still serves short requests
# mlx-lm copies a batch's KV when a row joins or leaves it (concatenate, gather), and both copies
# live for a moment: the KV's peak is up to twice what the batch keeps (measured: 1.7x the
# reservations, SmolLM2-135M, docs/benchmarks.md). A default budget leaves room for the copy.
PEAK_COPIES = 2

Verdict = Literal["fits", "waits", "never"]


@dataclass(frozen=True)
class LayerKv:
    """One layer's KV of one sequence: bytes a token adds, the most tokens it keeps (a sliding
    window; None: every token), and bytes it holds whatever the length (a recurrent state)."""

    per_token: int
    cap: int | None = None
    fixed: int = 0

    def bytes_for(self, tokens: int) -> int:
        kept = tokens if self.cap is None else min(tokens, self.cap)
        return self.fixed + self.per_token * kept


@dataclass(frozen=True)
class KvLayout:
    """What one sequence's KV costs, layer by layer (the draft model's layers too, when one runs);
    for a model whose recurrent state the prefix cache checkpoints on the prompt's way, the
    checkpoints' copies (``checkpoint_bytes`` each, ``checkpoints.checkpoint_count`` of them)."""

    layers: tuple[LayerKv, ...]
    checkpoint_bytes: int = 0
    block: int = 32  # the prefix cache's block, where checkpoints are taken

    def bytes_for(self, tokens: int) -> int:
        """The KV of one sequence of ``tokens`` tokens."""
        kept = sum(layer.bytes_for(tokens) for layer in self.layers)
        return kept + (self.checkpoint_bytes * checkpoint_count(tokens, self.block) if self.checkpoint_bytes else 0)

    @property
    def per_token(self) -> int:
        """Bytes a token adds while no layer is at its cap (what /v1/status shows)."""
        return sum(layer.per_token for layer in self.layers)

    def batch_bytes(self, widths: list[int]) -> int:
        """A batch of rows of these widths (tokens): each padded to the widest."""
        return len(widths) * self.bytes_for(max(widths)) if widths else 0

    def longest_within(self, budget: int) -> int | None:
        """The most tokens one sequence alone may hold within ``budget`` bytes; None: any length
        (every layer capped below the budget)."""
        if self.bytes_for(1 << 40) <= budget:
            return None
        low, high = 0, 1 << 40  # bytes_for(low) <= budget < bytes_for(high)
        if self.bytes_for(0) > budget:
            return 0
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.bytes_for(mid) <= budget else (low, mid)
        return low


@dataclass(frozen=True)
class KvBudget:
    """The budget one engine admits by; swapped whole when it changes (a live setting).

    ``limit`` None: no budget (the layout or the machine's memory is unknown), everything fits.
    ``slack``: tokens added to every row (the growth step, draft positions).
    """

    layout: KvLayout | None
    limit: int | None = None
    source: str = "none"
    slack: int = GROWTH_STEP

    @property
    def active(self) -> bool:
        return self.layout is not None and self.limit is not None

    def width(self, prompt_tokens: int, max_tokens: int) -> int:
        """The tokens a request's row may reach, counted as the batch holds it."""
        return prompt_tokens + max_tokens + self.slack

    def verdict(self, admitted: list[int], width: int) -> Verdict:
        """Whether a row of ``width`` joins rows of ``admitted`` widths now, waits for some to
        finish, or could never run (not even alone)."""
        if self.layout is None or self.limit is None:
            return "fits"
        if self.layout.batch_bytes([width]) > self.limit:
            return "never"
        return "fits" if self.layout.batch_bytes([*admitted, width]) <= self.limit else "waits"

    def reserved(self, admitted: list[int]) -> int:
        """Bytes the admitted rows reserve together."""
        return self.layout.batch_bytes(admitted) if self.layout is not None else 0

    def largest_request(self) -> int | None:
        """The most tokens (prompt + max_tokens) one request may have; None: no limit."""
        if self.layout is None or self.limit is None:
            return None
        longest = self.layout.longest_within(self.limit)
        return None if longest is None else max(longest - self.slack, 0)

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str:
        """Why a request can never run here, with the numbers."""
        assert self.layout is not None and self.limit is not None  # only an active budget refuses
        need = self.layout.batch_bytes([self.width(prompt_tokens, max_tokens)])
        largest = self.largest_request() or 0
        return (
            f"the request needs {mb(need)} of KV cache ({prompt_tokens:,} prompt + {max_tokens:,} max_tokens "
            f"tokens at {self.layout.per_token:,} bytes a token, with {self.slack} positions of the cache's "
            f"growth) and the model's KV budget is {mb(self.limit)} ({self.source}), room for {largest:,} tokens "
            f"in one request: lower max_tokens or shorten the prompt"
        )

    def with_limit(self, limit: int | None, source: str) -> KvBudget:
        return replace(self, limit=limit, source=source)

    def describe(self, reserved: int, held: int, peak: int) -> dict:
        """The budget's part of /v1/status's ``kv_budget`` block: ``reserved`` by the admitted
        requests, ``held`` by the batch's buffers now and ``peak`` at most so far (bytes)."""
        return {
            "budget_mb": _mb(self.limit) if self.active else None,
            "source": self.source,
            "bytes_per_token": self.layout.per_token if self.layout is not None else None,
            "largest_request_tokens": self.largest_request(),
            "reserved_mb": _mb(reserved),
            "held_mb": _mb(held),
            "peak_held_mb": _mb(peak),
        }


def default_limit(usable: int | None, usable_source: str, held: int, cache_budget: int) -> tuple[int | None, str]:
    """The budget when ``max_kv_memory_mb`` is not set: usable memory (physical, a cgroup's limit
    or Metal's working set, the lowest) less what the worker holds at start (weights), the prefix
    cache's budget, the worker's own overhead and a margin, halved for the copies a batch makes
    (``PEAK_COPIES``); None when memory is unknown."""
    if not usable:
        return None, "none: the machine's memory is unknown"
    margin = max(int(usable * MARGIN_FRACTION), MARGIN_MIN)
    left = (usable - held - cache_budget - WORKER_OVERHEAD - margin) // PEAK_COPIES
    note = (
        f"default: ({mb(usable)} usable ({usable_source}) - {mb(held)} held at start - {mb(cache_budget)} "
        f"prefix cache - {mb(WORKER_OVERHEAD)} worker - {mb(margin)} margin) / {PEAK_COPIES} for the "
        "copies a batch makes"
    )
    if left < FLOOR:
        return FLOOR, f"{note} is below {mb(FLOOR)}: {mb(FLOOR)}"
    return left, note


def mb(n: int) -> str:
    """``1,234.5 MB``."""
    return f"{n / MIB:,.1f} MB"


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / MIB, 3)
