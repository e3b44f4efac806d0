"""The doctor's self-test: one model through the engine's batch, prefix cache, speculation and
quantized KV cache, each path on its own scheduler, its answers compared token for token with
mlx-lm's own greedy ones (agreement.compare, the near-tie rule the engine's tests use), and each
agreed token's log-probability within the same rounding: builtin:tiny's random weights keep their
greedy tokens through a KV cache gone slightly wrong, not their log-probabilities."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..batch.layout import CacheLayout, read_layout
from ..cache.cache_setup import make_prefix_cache
from ..options import EngineOptions, SpeculationOptions
from . import oracle
from .agreement import Report, compare
from .driver import Driver

PATHS = ("batch", "prefix_cache", "speculation", "kv_quantized")
GENERATE = 8  # tokens each answer: enough to pass through a few decode and verify steps
HALVES = (16, 40, 28)  # the prompts' first halves in tokens: unequal, so prefills pad; the second repeats them
PREFILL_STEP = 48
KV_BITS, KV_GROUP = 8, 64
TEXT = (
    "The engine serves many requests at once on one thread. Each step decodes a token for every "
    "running row, prefills a chunk of the prompts that wait, and stores finished rows' keys and "
    "values in blocks so that the next request with the same start reads them back. A quick brown "
    "fox jumps over the lazy dog while the scheduler counts what it drafted and what it kept."
)
TURN = " And then, what comes next in this story?"


@dataclass
class PathResult:
    """One path's verdict: ``ok``, ``warn`` (it could not run here, and why) or ``fail``."""

    name: str
    level: str
    detail: str
    seconds: float = 0.0
    compared: int = 0
    departures: list[str] = field(default_factory=list)  # each, tolerated (near-tie) or not
    cached: list[int] = field(default_factory=list)  # prompt tokens each request took from the cache
    drafted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_prompts(encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Three prompts whose second halves repeat their first (prompt lookup finds drafts), from
    the model's own tokenizer so that any model's vocabulary fits."""
    base = encode(TEXT)
    while len(base) < max(HALVES) + 8:
        base = base + base
    return [base[i : i + n] * 2 for i, n in zip((0, 5, 3), HALVES)]


def follow_ups(prompts: list[list[int]], answers: list[tuple[int, ...]], turn: list[int], kind: str) -> list[list[int]]:
    """Second requests that share a prefix with the first: each prompt, its answer and a new turn
    (an agent's next request, which every kind of cache serves); where the cache holds plain
    blocks, the first instead shares only a start (a new chat on the same system prompt)."""
    out = [p + list(a) + turn for p, a in zip(prompts, answers)]
    if kind == "blocks":
        out[-1] = prompts[-1][: len(prompts[-1]) * 3 // 4] + turn
    return out


def options(**overrides: Any) -> EngineOptions:
    settings: dict[str, Any] = dict(max_num_seqs=8, prefill_step_size=PREFILL_STEP, cache_budget_bytes=0)
    settings.update(overrides)
    return EngineOptions(**settings)


def judge(
    name: str, report: Report, seconds: float, *, cached: list[int] | None = None, drafted: int | None = None
) -> PathResult:
    """A path's verdict from its comparison: every answer mlx-lm's (near-ties aside), the cache
    reused on every second request (``cached``), drafts made (``drafted``)."""
    mine = [d for d in report.departures if d.path == name]
    failed = [d for d in mine if not d.tolerated]
    result = PathResult(
        name, "ok", "", round(seconds, 3), report.compared, [d.describe() for d in mine], cached or [], drafted or 0
    )
    if failed:
        result.level, result.detail = "fail", "differs from mlx-lm: " + "; ".join(d.describe() for d in failed)
    elif cached is not None and not all(cached):
        result.level, result.detail = "fail", f"the prefix cache was not reused (tokens taken per request: {cached})"
    elif drafted == 0:
        result.level, result.detail = "fail", "prompt lookup made no draft on prompts that repeat themselves"
    else:
        tolerated = f", {len(mine)} near-tie(s)" if mine else ""
        what = "tokens and their log-probabilities" if report.logprobs_compared == report.compared else "tokens"
        result.detail = f"{report.compared} {what} as mlx-lm's{tolerated}"
        if cached is not None:
            result.detail += f", {sum(cached)} prompt tokens from the cache"
        if drafted:
            result.detail += f", {drafted} drafted"
    return result


class SelfTest:
    """The four paths on one model; the references are computed once, on the prompt alone."""

    def __init__(self, model: Any, encode: Callable[[str], list[int]], weights: str = ""):
        self.model = model
        self.weights = weights
        self.layout: CacheLayout = read_layout(model)
        precision = oracle.precision_of(model)
        self.prompts = make_prompts(encode)
        started = time.perf_counter()
        self.refs = [oracle.reference(model, p, GENERATE) for p in self.prompts]
        self.kind = self.layout.prefix_cache(32)
        turn = encode(TURN)
        self.second = follow_ups(self.prompts, [r.tokens for r in self.refs], turn, self.kind)
        self.refs_second = [oracle.reference(model, p, GENERATE) for p in self.second]
        self.rounding = oracle.noise(model, self.prompts[0], self.refs[0].tokens)
        self.kv_rounding = oracle.kv_noise(model, self.prompts[0], self.refs[0].tokens, KV_BITS, KV_GROUP)
        self.reference_s = time.perf_counter() - started
        self.precision = precision

    def report(self) -> Report:
        return Report("selftest", self.precision, rounding=self.rounding, prefix_cache=self.kind)

    def run(self, name: str) -> PathResult:
        """One path by name (``PATHS``); an error inside the engine is that path's failure."""
        started = time.perf_counter()
        try:
            return getattr(self, f"_{name}")(started)
        except Exception as exc:  # the report names the path that broke, whatever broke it
            return PathResult(name, "fail", f"{type(exc).__name__}: {exc}", round(time.perf_counter() - started, 3))

    def _batch(self, started: float) -> PathResult:
        report = self.report()
        driver = Driver(self.model, options())
        try:
            answers, _ = driver.run(self.prompts, GENERATE, logprobs=True)
        finally:
            driver.close()
        compare(report, "batch", self.refs, answers, logprobs=driver.logprobs)
        return judge("batch", report, time.perf_counter() - started)

    def _cached(self, name: str, started: float, opts: EngineOptions, rounding: float) -> PathResult:
        report = self.report()
        driver = Driver(self.model, opts, make_prefix_cache(self.model, opts, weights=self.weights or None))
        try:
            first, _ = driver.run(self.prompts, GENERATE, logprobs=True)
            compare(report, name, self.refs, first, logprobs=driver.logprobs)
            second, cached = driver.run(self.second, GENERATE, logprobs=True)
        finally:
            driver.close()
        compare(report, name, self.refs_second, second, rounding=rounding, logprobs=driver.logprobs)
        return judge(name, report, time.perf_counter() - started, cached=cached)

    def _prefix_cache(self, started: float) -> PathResult:
        return self._cached("prefix_cache", started, options(cache_budget_bytes=64 << 20), self.rounding)

    def _kv_quantized(self, started: float) -> PathResult:
        if self.kind == "sequences":
            why = "its cache is held as whole sequences, which kv_bits leaves whole"
            return PathResult("kv_quantized", "warn", f"not run: {why}")
        opts = options(cache_budget_bytes=64 << 20, kv_bits=KV_BITS, kv_group_size=KV_GROUP)
        return self._cached("kv_quantized", started, opts, max(self.rounding, self.kv_rounding or 0.0))

    def _speculation(self, started: float) -> PathResult:
        why = self.layout.speculation()
        if why is not None:
            return PathResult("speculation", "warn", f"not run: this model does not speculate: {why}")
        report = self.report()
        driver = Driver(self.model, options(speculative=SpeculationOptions()))
        try:
            answers, _ = driver.run(self.prompts, GENERATE, logprobs=True)
            drafted = driver.drafted
        finally:
            driver.close()
        compare(report, "speculation", self.refs, answers, logprobs=driver.logprobs)
        return judge("speculation", report, time.perf_counter() - started, drafted=drafted)
