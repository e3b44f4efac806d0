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

**The near-tie rule.** At the first position where a path's token differs from the reference's,
the departure is tolerated when the reference's margin there (its top logit less the second) is
within what rounding explains: ``TIE`` for the precision (1e-3 in float32, 0.1 at 4 bits, whose
activations are bfloat16), or twice what two ways mlx-lm itself computes one sequence differ by
(``noise``: whole, or in chunks then token by token: latent attention's one-token step, a
Mamba-2 scan's chunks). Two correct computations that round differently may pick either of two
such tokens. The rest of that answer is not compared (it continues from another token). Any
other departure fails. On the CPU backend the suite runs on, float32 paths agree to the bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from tests.support.families import VOCAB, Precision, build, save
from vllmmlxd.engine.batch import row_groups
from vllmmlxd.engine.batch.layout import read_layout
from vllmmlxd.engine.cache.cache_setup import make_prefix_cache
from vllmmlxd.engine.cache.checkpoints import checkpoint_positions
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.speculation.speculative import SpeculationOptions
from vllmmlxd.engine.step.scheduler import Scheduler
from vllmmlxd.engine.step.sequence import Sequence
from vllmmlxd.engine.text.detokenize import IncrementalDetokenizer
from vllmmlxd.engine.types import EngineStats, GenerationRequest, SamplingParams

GENERATE = 8  # tokens each answer
LENGTHS = (80, 140, 50, 200)  # the prompts: unequal, all but one longer than a window, several chunks each
PREFILL_STEP = 48  # tokens a chunk at most: every prompt takes several
CHUNKS = (1, 5, 48, 16, 2, 48, 31, 7)  # the prefill chunk of each step in turn (Driver)
BLOCK = 32
# Nats. Float32 paths agree to the bit on the CPU backend but for kernels chosen by shape; at
# 4 bits, activations are bfloat16 (8 bits of mantissa), and a batch's rows that differ in length
# attend with a mask array where one row alone attends with none: answers of mlx-lm's own batches
# move by up to 0.25 from its single-sequence ones (gemma4_text), whose float32 ones agree to the bit.
TIE = {"float32": 1e-3, "q4": 0.1}
TIE_NOISE = 2  # times the rounding mlx-lm's own two computations of a sequence show (noise())
PATHS = ("batched", "again", "extended", "shared", "disk", "alone")


@dataclass(frozen=True)
class Reference:
    """mlx-lm's greedy answer to one prompt, and at each position the margin of its choice (its
    logit less the runner-up's) and its logit."""

    tokens: tuple[int, ...]
    margins: tuple[float, ...]
    tops: tuple[float, ...]


def reference(model: Any, prompt: list[int], n: int = GENERATE) -> Reference:
    seen: list[mx.array] = []

    def record(tokens: mx.array, logits: mx.array) -> mx.array:
        seen.append(logits)
        return logits

    steps = generate_step(
        mx.array(prompt), model, max_tokens=n, prompt_cache=make_prompt_cache(model), logits_processors=[record]
    )
    tokens = [int(token) for (token, _), _ in zip(steps, range(n))]
    margins, tops = [], []
    for logits in seen[:n]:
        top = np.sort(np.array(logits.astype(mx.float32)).reshape(-1))[-2:]
        margins.append(float(top[1] - top[0]))
        tops.append(float(top[1]))
    return Reference(tuple(tokens), tuple(margins), tuple(tops))


def noise(model: Any, prompt: list[int], answer: tuple[int, ...]) -> float:
    """How far two ways mlx-lm itself computes one sequence's logits differ (the prompt and its
    answer in one pass; the prompt in chunks, then the answer a token at a time): the rounding
    of this family at this precision, which a path of the engine may show too."""
    tokens = prompt + list(answer)
    start = len(prompt) - 1
    whole = model(mx.array([tokens]), cache=make_prompt_cache(model))[0, start:].astype(mx.float32)
    cache, parts, at = make_prompt_cache(model), [], 0
    while at < start:
        stop = min(at + PREFILL_STEP, start)
        model(mx.array([tokens[at:stop]]), cache=cache)
        at = stop
    for token in tokens[start:]:
        parts.append(model(mx.array([[token]]), cache=cache)[0])
    return float(mx.abs(whole - mx.concatenate(parts).astype(mx.float32)).max())


def near_tie(precision: str, margin: float, rounding: float) -> bool:
    """Whether two correct computations may pick either of the top two tokens: a margin within
    ``TIE`` for the precision, or within twice the ``rounding`` mlx-lm's own computations of one
    sequence show (``noise``)."""
    return margin <= max(TIE[precision], TIE_NOISE * rounding)


@dataclass(frozen=True)
class Departure:
    path: str
    prompt: int
    position: int  # in the answer
    expected: int
    got: int | None  # None: the answer ended before this position
    margin: float
    tolerated: bool


@dataclass
class Report:
    """What one family at one precision did on every path."""

    family: str
    precision: str
    departures: list[Departure] = field(default_factory=list)
    cached: dict[str, list[int]] = field(default_factory=dict)  # prompt tokens each path took from the cache
    compared: int = 0  # tokens compared, all paths
    rounding: float = 0.0  # the family's rounding at this precision (noise())
    prefix_cache: str = ""  # CacheLayout.prefix_cache: what the cache could hold
    speculates: bool = False  # the layout lets the family speculate
    drafted: int = 0  # draft tokens the batched paths verified

    def departed(self, prompt: int, paths: tuple[str, ...]) -> bool:
        """Whether one of ``paths`` answered ``prompt`` otherwise than the reference (a near-tie)."""
        return any(d.prompt == prompt and d.path in paths for d in self.departures)

    @property
    def failures(self) -> list[Departure]:
        return [d for d in self.departures if not d.tolerated]

    def summary(self) -> str:
        return f"{self.family}/{self.precision}: " + "; ".join(
            f"{d.path} prompt {d.prompt} token {d.position}: {d.got} for {d.expected} at margin {d.margin:.4f}"
            for d in self.failures
        )


def compare(report: Report, path: str, refs: list[Reference], answers: list[list[int]]) -> None:
    for i, (ref, got) in enumerate(zip(refs, answers)):
        for position, expected in enumerate(ref.tokens):
            report.compared += 1
            token = got[position] if position < len(got) else None
            if token == expected:
                continue
            margin = ref.margins[position]
            tolerated = token is not None and near_tie(report.precision, margin, report.rounding)
            report.departures.append(Departure(path, i, position, expected, token, margin, tolerated))
            break
        else:
            if len(got) != len(ref.tokens):
                report.departures.append(Departure(path, i, len(ref.tokens), -1, len(got), 0.0, False))


def prompts(seed: int = 1) -> list[list[int]]:
    """Four prompts whose second halves repeat their first (prompt lookup finds drafts)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in LENGTHS:
        half = rng.integers(1, VOCAB - 1, size=n // 2).tolist()
        out.append(half + half[: n - len(half)])
    return out


class Driver:
    """A scheduler on a real model, stepped from the test's thread; answers read back as token ids."""

    def __init__(self, model: Any, options: EngineOptions, cache: Any = None, draft: Any = None):
        self.loop = asyncio.new_event_loop()
        self.scheduler = Scheduler(model, set(), options, EngineStats(), cache=cache, draft=draft)
        # Chunk sizes by construction, not by the machine's pace: odd ones among them (a one-token
        # chunk takes mlx-lm's decoding path), the same on every run.
        sizes = itertools.cycle(CHUNKS)
        self.scheduler.timer.chunk = lambda *args, **kwargs: next(sizes)  # type: ignore[method-assign]
        ticks = itertools.count()
        self.scheduler.clock = lambda: next(ticks) * 0.01  # speculation's step costs, by construction too

    def run(self, batch: list[list[int]]) -> tuple[list[list[int]], list[int]]:
        """Answers to ``batch`` submitted together, and the prompt tokens each took from the cache."""
        seqs = []
        for prompt in batch:
            params = SamplingParams(max_tokens=GENERATE, temperature=0.0, ignore_eos=True)
            request = GenerationRequest(list(prompt), params)
            seq = Sequence(request, self.loop, IncrementalDetokenizer(_ids_text, request.prompt_tokens), set(), set())
            self.scheduler.inbox.put(seq)
            seqs.append(seq)
        for _ in range(10_000):
            if all(s.finished for s in seqs):
                break
            assert self.scheduler.step()
        else:
            raise AssertionError("the engine did not finish")
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()
        answers = []
        for seq in seqs:
            text = ""
            while not seq.events.empty():
                text += getattr(seq.events.get_nowait(), "text", "")
            answers.append([int(t) for t in re.findall(r"<(\d+)>", text)])
        return answers, [s.progress.cached_tokens for s in seqs]

    def close(self) -> None:
        self.scheduler.shutdown()
        self.loop.close()


def _ids_text(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


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
        spec = driver.scheduler.spec
        report.drafted = spec.stats.drafted if spec is not None else 0
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
