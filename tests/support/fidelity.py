"""The fidelity harness: every path of the engine, token for token, against mlx-lm's own greedy
generation, on a tiny random model of one family (tests/support/families.py).

The oracle is mlx-lm's ``generate_step`` on the prompt alone. The engine's paths, each on the
same four prompts of unequal lengths (so prefills are batched with right padding, and long
enough that windows slide and prompts take several chunks), whose second halves repeat their
first (so prompt lookup drafts, where the family speculates):

- ``batched``: the four at once, continuous batching and speculation as served by default (the
  rows joining one by one keep their KV in groups, merged past two);
- ``again``: the same four again (prefix cache hits: blocks, windows, checkpoints);
- ``extended``: each prompt, its answer and a new turn (an agent's next request);
- ``shared``: a new request sharing a start with each (a new chat on the same system prompt);
- ``disk``: a fresh engine over the same disk tier (a restart), the four again;
- ``alone``: one at a time, no speculation, no cache (the plainest path).

The oracle (mlx-lm's greedy answers), the near-tie rule that judges a departure from them and the
driver that steps the scheduler are the package's (vllmmlxd/engine/selftest/), shared with
``vllmmlxctl doctor``'s self-test: one rule for both. On the CPU backend the suite runs on,
float32 paths agree to the bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.families import VOCAB, Precision, build, save
from vllmmlxd.engine.batch import row_groups
from vllmmlxd.engine.batch.layout import read_layout
from vllmmlxd.engine.cache.cache_setup import make_prefix_cache
from vllmmlxd.engine.cache.checkpoints import checkpoint_positions
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.selftest import driver as engine_driver
from vllmmlxd.engine.selftest import oracle
from vllmmlxd.engine.selftest.agreement import Report, compare
from vllmmlxd.engine.selftest.oracle import Reference, noise
from vllmmlxd.engine.speculation.speculative import SpeculationOptions

__all__ = ["Reference", "Report", "compare", "noise"]  # the package's, used through this module by the tests

GENERATE = 8  # tokens each answer
LENGTHS = (80, 140, 50, 200)  # the prompts: unequal, all but one longer than a window, several chunks each
PREFILL_STEP = 48  # tokens a chunk at most: every prompt takes several
BLOCK = 32
PATHS = ("batched", "again", "extended", "shared", "disk", "alone")


def reference(model: Any, prompt: list[int], n: int = GENERATE) -> Reference:
    return oracle.reference(model, prompt, n)


def prompts(seed: int = 1) -> list[list[int]]:
    """Four prompts whose second halves repeat their first (prompt lookup finds drafts)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in LENGTHS:
        half = rng.integers(1, VOCAB - 1, size=n // 2).tolist()
        out.append(half + half[: n - len(half)])
    return out


class Driver(engine_driver.Driver):
    """The package's driver, answering ``GENERATE`` tokens (read when it runs: tests change it)."""

    def run(
        self, batch: list[list[int]], n: int | None = None, *, logprobs: bool = False
    ) -> tuple[list[list[int]], list[int]]:
        return super().run(batch, GENERATE if n is None else n, logprobs=logprobs)


def options(tmp: Path | None, **overrides: Any) -> EngineOptions:
    settings: dict[str, Any] = dict(
        max_num_seqs=8,
        prefill_step_size=PREFILL_STEP,
        cache_budget_bytes=64 << 20,
        speculative=SpeculationOptions(),
    )
    if tmp is not None:
        settings.update(cache_disk_dir=tmp / "kv", cache_disk_budget_bytes=256 << 20)
    settings.update(overrides)
    return EngineOptions(**settings)


@contextlib.contextmanager
def few_groups() -> Iterator[None]:
    """Rows in KV groups merge past two groups (four by default): the harness's four prompts,
    joining one by one, then merge their groups too."""
    held = row_groups.MAX_GROUPS
    row_groups.MAX_GROUPS = 2
    try:
        yield
    finally:
        row_groups.MAX_GROUPS = held


def check(family: str, precision: Precision, tmp: Path, paths: tuple[str, ...] = PATHS) -> Report:
    """Every path of the engine on ``family`` at ``precision`` (or those of ``paths``, and the
    ones they are served from: a test of one breakage), against the reference."""
    with few_groups():
        return _check(family, precision, tmp, set(paths))


def _check(family: str, precision: Precision, tmp: Path, paths: set[str]) -> Report:
    model = build(family, precision)
    layout = read_layout(model)
    report = Report(family, precision, prefix_cache=layout.prefix_cache(BLOCK), speculates=layout.speculation() is None)
    rng = np.random.default_rng(7)
    first = prompts()
    refs = [reference(model, p) for p in first]
    extended = [p + list(r.tokens) + rng.integers(1, VOCAB - 1, size=20).tolist() for p, r in zip(first, refs)]
    shared = [p[: len(p) * 3 // 4] + rng.integers(1, VOCAB - 1, size=24).tolist() for p in first]
    refs_extended = [reference(model, p) for p in extended] if paths & {"extended"} else []
    refs_shared = [reference(model, p) for p in shared] if paths & {"shared"} else []
    if precision != "float32":  # float32's rounding is far below its tie (TIE): no need to measure it
        report.rounding = noise(model, first[2], refs[2].tokens)  # the shortest prompt: a scan costs its length
    weights = save(family, precision, tmp / "model")  # keys the disk tier
    opts = options(tmp)
    driver = Driver(model, opts, make_prefix_cache(model, opts, weights=weights))
    try:
        for path, batch, expected in (
            ("batched", first, refs),
            ("again", first, refs),
            ("extended", extended, refs_extended),
            ("shared", shared, refs_shared),
        ):
            if path in ("batched", "again") or path in paths:  # the later paths are served from these two
                answers, report.cached[path] = driver.run(batch)
                compare(report, path, expected, answers)
        report.drafted = driver.drafted
    finally:
        driver.close()  # the disk tier's writer finishes what it was handed
    if "disk" in paths:
        driver = Driver(model, opts, make_prefix_cache(model, opts, weights=weights))
        try:
            answers, report.cached["disk"] = driver.run(first)
            compare(report, "disk", refs, answers)
        finally:
            driver.close()
    if "alone" in paths:
        driver = Driver(model, options(None, max_num_seqs=1, speculative=None, cache_budget_bytes=0))
        try:
            answers = [driver.run([p])[0][0] for p in first]
            compare(report, "alone", refs, answers)
        finally:
            driver.close()
    return report


def expected_reuse(kind: str, path: str, n: int) -> int:
    """The prompt tokens a path takes from the cache at least, for an ``n``-token prompt of
    ``prompts()``, by what the cache holds (``CacheLayout.prefix_cache``)."""
    if kind == "sequences" or path in ("batched", "alone"):
        return 0
    if path == "again":  # all but the last token; a recurrent model from its last checkpoint
        return (n - 1) // BLOCK * BLOCK if kind == "blocks+checkpoints" else n - 1
    if path == "extended":  # the prompt and the answer, kept when the answer finished
        return n + GENERATE
    if path == "shared":  # a recurrent model: the last checkpoint the first prompt made within
        k = n * 3 // 4
        if kind != "blocks+checkpoints":
            return k
        return max((c for c in checkpoint_positions(0, n, BLOCK) if c <= k), default=0)
    assert path == "disk"  # full blocks reach the disk, and the checkpoints on them
    return n // BLOCK * BLOCK
