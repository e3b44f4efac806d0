"""When an engine path's answer agrees with mlx-lm's: token for token, but for near-ties.

**The near-tie rule.** At the first position where a path's token differs from the reference's,
the departure is tolerated when the reference's margin there (its top logit less the second) is
within what rounding explains: ``TIE`` for the precision (1e-3 in float32, 0.1 at lower ones,
whose activations are bfloat16 or float16), or twice what two ways mlx-lm itself computes one
sequence differ by (``oracle.noise``). Two correct computations that round differently may pick
either of two such tokens. The rest of that answer is not compared (it continues from another
token). Any other departure fails.

Where a path's log-probabilities are read too, each agreed token's must stay within the same bound
of mlx-lm's: a KV cache that hands back slightly wrong keys or values may keep a tiny random
model's greedy tokens (their margins are wide) but moves its log-probabilities. No mlx here:
numbers in, a verdict out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Nats. Float32 paths agree to the bit on the CPU backend but for kernels chosen by shape; at
# 4 bits, activations are bfloat16 (8 bits of mantissa), and a batch's rows that differ in length
# attend with a mask array where one row alone attends with none: answers of mlx-lm's own batches
# move by up to 0.25 from its single-sequence ones (gemma4_text), whose float32 ones agree to the bit.
TIE = {"float32": 1e-3, "q4": 0.1}
TIE_NOISE = 2  # times the rounding mlx-lm's own two computations of a sequence show (oracle.noise)


class Reference(Protocol):
    """mlx-lm's answer to one prompt and, at each position, the margin of its choice (oracle.Reference)."""

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def margins(self) -> tuple[float, ...]: ...

    @property
    def logprobs(self) -> tuple[float, ...]: ...


def tie(precision: str) -> float:
    """The margin rounding explains at ``precision``: float32's, or that of the lower precisions
    (bfloat16, float16, quantized weights), whose activations carry 8 to 11 bits of mantissa."""
    return TIE.get(precision, TIE["q4"])


def within_rounding(precision: str, rounding: float) -> float:
    """How far two correct computations of one logit may differ: ``TIE`` for the precision, or
    twice the ``rounding`` mlx-lm's own computations of one sequence show (``oracle.noise``)."""
    return max(tie(precision), TIE_NOISE * rounding)


def near_tie(precision: str, margin: float, rounding: float) -> bool:
    """Whether two correct computations may pick either of the top two tokens: a margin within
    rounding (``within_rounding``)."""
    return margin <= within_rounding(precision, rounding)


@dataclass(frozen=True)
class Departure:
    path: str
    prompt: int
    position: int  # in the answer
    expected: int
    got: int | None  # None: the answer ended before this position
    margin: float
    tolerated: bool
    logprob: tuple[float, float] | None = None  # the same token, its log-probability moved: (expected, got)

    def describe(self) -> str:
        if self.expected == -1:  # the answer's length differs (compare)
            return f"{self.path} prompt {self.prompt}: {self.got} tokens for {self.position}"
        if self.logprob is not None:
            want, got = self.logprob
            return f"{self.path} prompt {self.prompt} token {self.position}: log-probability {got:.4f} for {want:.4f}"
        return (
            f"{self.path} prompt {self.prompt} token {self.position}: {self.got} for {self.expected} "
            f"at margin {self.margin:.4f}"
        )


@dataclass
class Report:
    """What one model (a test's family, or the doctor's model) at one precision did on its paths."""

    family: str
    precision: str
    departures: list[Departure] = field(default_factory=list)
    cached: dict[str, list[int]] = field(default_factory=dict)  # prompt tokens each path took from the cache
    compared: int = 0  # tokens compared, all paths
    logprobs_compared: int = 0  # of those, whose log-probabilities were compared too
    rounding: float = 0.0  # the model's rounding at this precision (oracle.noise)
    prefix_cache: str = ""  # CacheLayout.prefix_cache: what the cache could hold
    speculates: bool = False  # the layout lets the model speculate
    drafted: int = 0  # draft tokens the batched paths verified

    def departed(self, prompt: int, paths: tuple[str, ...]) -> bool:
        """Whether one of ``paths`` answered ``prompt`` otherwise than the reference (a near-tie)."""
        return any(d.prompt == prompt and d.path in paths for d in self.departures)

    @property
    def failures(self) -> list[Departure]:
        return [d for d in self.departures if not d.tolerated]

    def summary(self) -> str:
        return f"{self.family}/{self.precision}: " + "; ".join(d.describe() for d in self.failures)


def compare(
    report: Report,
    path: str,
    refs: Sequence[Reference],
    answers: Sequence[Sequence[int]],
    rounding: float | None = None,
    logprobs: Sequence[Sequence[float]] | None = None,
) -> None:
    """Add to ``report`` each answer's first departure from its reference, tolerated or not;
    ``rounding``: this path's own (a quantized KV cache rounds more), else the report's;
    ``logprobs``: the path's log-probability of each token it wrote, checked where tokens agree."""
    noise = report.rounding if rounding is None else rounding
    bound = within_rounding(report.precision, noise)
    for i, (ref, got) in enumerate(zip(refs, answers)):
        mine = logprobs[i] if logprobs is not None else ()
        for position, expected in enumerate(ref.tokens):
            report.compared += 1
            token = got[position] if position < len(got) else None
            if token == expected:
                if position >= min(len(mine), len(ref.logprobs)):
                    continue
                report.logprobs_compared += 1
                want = ref.logprobs[position]
                if abs(mine[position] - want) <= bound:
                    continue
                margin = ref.margins[position]
                report.departures.append(
                    Departure(path, i, position, expected, token, margin, False, (want, mine[position]))
                )
                break
            margin = ref.margins[position]
            tolerated = token is not None and near_tie(report.precision, margin, noise)
            report.departures.append(Departure(path, i, position, expected, token, margin, tolerated))
            break
        else:
            if len(got) != len(ref.tokens):
                report.departures.append(Departure(path, i, len(ref.tokens), -1, len(got), 0.0, False))
