"""How wide a speculative step drafts: the width with the most tokens per second, from each
row's acceptance and what the batch's steps cost (``StepCosts``, measured as the engine loop
runs them). Pure; no mlx. Used by ``speculative.SpeculativeBatch``."""

from __future__ import annotations

from typing import Callable


def expected_accepted(alpha: float, k: int) -> float:
    """Tokens a row accepts on average from ``k`` drafts, each accepted with probability ``alpha``
    given the ones before it were."""
    if k <= 0:
        return 0.0
    if alpha >= 1.0:
        return float(k)
    return alpha * (1 - alpha**k) / (1 - alpha)


def best_width(
    drafts: list[int], alphas: list[float], cost: tuple[float, float] | None, *, drafting: bool = False
) -> int:
    """The draft width (tokens verified a row, less one) that yields the most tokens per second:
    a step costs ``a + b * drafted`` (``a``: the plain step, ``b``: each drafted position it
    verifies on top); a row with ``n`` drafts at width ``K`` verifies ``min(n, K)`` of them. No
    cost measured yet: the widest. ``drafting``: the best width above 0."""
    widest = max(drafts, default=0)
    if cost is None or widest == 0:
        return widest
    plain, per_draft = cost
    rows = len(drafts)

    def rate(k: int) -> float:
        gained = sum(expected_accepted(a, min(n, k)) for n, a in zip(drafts, alphas))
        return (rows + gained) / (plain + per_draft * rows * k)

    return max(range(1 if drafting else 0, widest + 1), key=rate)


class StepCosts:
    """What the batch's steps really cost, timed from one step's start to the next's: the
    scheduler's work between them counts, and so does mlx-lm's overlap of a plain step's forward
    pass with it (a verifying step waits for its logits). A plain step's seconds are kept by row
    count; each drafted position a verifying step adds is priced against the plain step of as
    many rows. A step that also prefilled, admitted or finished rows is not timed. Until a cost
    is measured, ``prefill`` stands in: the step timer's fit of a forward pass, ``a + b * tokens``."""

    def __init__(self, prefill: Callable[[], tuple[float, float] | None] = lambda: None, alpha: float = 0.2):
        self.prefill = prefill
        self.alpha = alpha
        self.plain: dict[int, float] = {}
        self.per_draft: float | None = None  # seconds a verified drafted position adds to a step
        self.last: tuple[int, int] | None = None  # the step just run: (rows, drafted positions verified)
        self._started: float | None = None
        self._clean = False

    def lap(self, now: float) -> None:
        """A step starts at ``now``: the one before it is timed, if it was a step of its own."""
        if self._started is not None and self._clean and self.last is not None:
            rows, drafted = self.last
            seconds = now - self._started
            plain = self.plain.get(rows)
            if not drafted:
                self.plain[rows] = self._moved(plain, seconds)
            elif plain is not None:
                extra = max(seconds - plain, 0.0) / drafted
                fit = self.prefill()
                known = self.per_draft if self.per_draft is not None else fit[1] if fit is not None else None
                if known is not None:  # one slow step (a new shape's first run, a pause) moves it a little
                    extra = min(extra, 2 * known)
                self.per_draft = self._moved(self.per_draft, extra)
        self._started, self._clean, self.last = now, False, None

    def ended(self, *, alone: bool) -> None:
        """The step ran; ``alone``: it only decoded (no prefill, no row joined or left)."""
        self._clean = alone

    def _moved(self, old: float | None, new: float) -> float:
        """A moving average's next value."""
        return new if old is None else old + self.alpha * (new - old)

    def cost(self, rows: int) -> tuple[float, float] | None:
        """(a plain step of ``rows`` rows, a drafted position) in seconds: measured where it was,
        else from the prefill fit."""
        plain = self.plain.get(rows)
        fit = self.prefill()
        if fit is not None:
            plain = plain if plain is not None else fit[0] + fit[1] * rows
            return plain, self.per_draft if self.per_draft is not None else fit[1]
        if plain is not None and self.per_draft is not None:
            return plain, self.per_draft
        return None
