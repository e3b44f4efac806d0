"""How wide a speculative step drafts: the width with the most tokens per second, from each
row's acceptance and what the batch's steps cost (``StepCosts``, measured as the engine loop
runs them). Pure; no mlx. Used by ``speculative.SpeculativeBatch``."""

from __future__ import annotations

from collections.abc import Callable

StepCost = Callable[[int], float]  # seconds of a step that verifies a width of drafts a row (0: a plain step)


def expected_accepted(alpha: float, k: int) -> float:
    """Tokens a row accepts on average from ``k`` drafts, each accepted with probability ``alpha``
    given the ones before it were."""
    if k <= 0:
        return 0.0
    if alpha >= 1.0:
        return float(k)
    return alpha * (1 - alpha**k) / (1 - alpha)


def best_width(drafts: list[int], alphas: list[float], cost: StepCost | None, *, avoid: int | None = None) -> int:
    """The draft width (tokens verified a row, less one) that yields the most tokens per second;
    a row with ``n`` drafts at width ``K`` verifies ``min(n, K)`` of them. No cost measured yet:
    the widest. ``avoid``: the best width other than this one (a runner-up, measured again now
    and then), when there is another."""
    widest = max(drafts, default=0)
    if cost is None or widest == 0:
        return widest
    rows = len(drafts)

    def rate(k: int) -> float:
        gained = sum(expected_accepted(a, min(n, k)) for n, a in zip(drafts, alphas))
        return (rows + gained) / cost(k)

    widths = [k for k in range(widest + 1) if k != avoid] or [widest]
    return max(widths, key=rate)


class StepCosts:
    """What the batch's steps really cost, timed from one step's start to the next's: the
    scheduler's work between them counts, and so does mlx-lm's overlap of a plain step's forward
    pass with it (a verifying step waits for its logits). A plain step's seconds are kept by row
    count, a verifying step's by row count and width: on a CPU a pass over a few positions a row
    is not a straight line in their number (the BLAS library's small matrix products jump in
    cost at some widths). A width not measured yet is priced from the plain step and what a
    verified position has added on average. A step that also prefilled, admitted or finished
    rows is not timed. Until a cost is measured, ``prefill`` stands in: the step timer's fit of
    a forward pass, ``a + b * tokens``."""

    def __init__(self, prefill: Callable[[], tuple[float, float] | None] = lambda: None, alpha: float = 0.2):
        self.prefill = prefill
        self.alpha = alpha
        self.plain: dict[int, float] = {}
        self.verify: dict[tuple[int, int], float] = {}  # (rows, width) -> seconds
        self.per_draft: float | None = None  # seconds a verified drafted position adds to a step, on average
        self.last: tuple[int, int] | None = None  # the step just run: (rows, width; 0 for a plain step)
        self._started: float | None = None
        self._clean = False

    def lap(self, now: float) -> None:
        """A step starts at ``now``: the one before it is timed, if it was a step of its own."""
        if self._started is not None and self._clean and self.last is not None:
            rows, width = self.last
            seconds = now - self._started
            plain = self.plain.get(rows)
            if not width:
                self.plain[rows] = self._moved(plain, seconds)
            elif plain is not None:
                known = self.verify.get((rows, width))
                if known is None and self.per_draft is not None:
                    known = plain + self.per_draft * rows * width
                if known is not None:  # one slow step (a new shape's first run, a pause) moves it a little
                    seconds = min(seconds, 2 * known)
                self.verify[(rows, width)] = self._moved(self.verify.get((rows, width)), seconds)
                self.per_draft = self._moved(self.per_draft, max(seconds - plain, 0.0) / (rows * width))
        self._started, self._clean, self.last = now, False, None

    def ended(self, *, alone: bool) -> None:
        """The step ran; ``alone``: it only decoded (no prefill, no row joined or left)."""
        self._clean = alone

    def _moved(self, old: float | None, new: float) -> float:
        """A moving average's next value."""
        return new if old is None else old + self.alpha * (new - old)

    def cost(self, rows: int) -> StepCost | None:
        """Seconds of a step of ``rows`` rows by width: measured where it was, else from the plain
        step and the average drafted position, else from the prefill fit."""
        plain = self.plain.get(rows)
        per_draft = self.per_draft
        fit = self.prefill()
        if fit is not None:
            plain = plain if plain is not None else fit[0] + fit[1] * rows
            per_draft = per_draft if per_draft is not None else fit[1]
        if plain is None or per_draft is None:
            return None
        base, each = plain, per_draft
        measured = {width: s for (r, width), s in self.verify.items() if r == rows}

        def seconds(width: int) -> float:
            if width == 0:
                return base
            return measured.get(width, base + each * rows * width)

        return seconds
