"""How many prompt tokens to prefill in a step. Pure; no mlx.

A step runs one decode step of the batch, then a chunk of each prompt being prefilled. A
prefill call costs roughly ``a + b * tokens`` (``a``: reading the weights once, ``b``: the
compute per token); both are fitted by exponentially weighted least squares over recent
steps, so the chunk follows the machine as load changes. Measured, not guessed, because it
depends on the model and the machine: 512 tokens take a few milliseconds on one and two
minutes on another.

Two bounds size the chunk, and the tighter wins:

- a step's prefill takes at most ``max_step_s`` seconds (about one), alone or not, so that a
  prompt's progress is seen and a cancel is heard at least that often;
- while others stream, a step's prefill takes at most ``share`` decode steps, so a running
  stream's gap between tokens grows to at most ``1 + share`` decode steps.

A model's estimate can be off in a way no fit of ``a + b * tokens`` sees: a chunk costs more as
its prompt's prefix grows (attention reads every earlier position), and a step that prefills does
not overlap its decode with the host's work as a decode-only step does. So while others stream,
the chunk is also scaled by feedback: a step longer than ``1 + share`` decode steps shrinks the
next chunks, a shorter one lets them grow back.

When the chunk rides on the batch's decode pass (``riding``: engine/batch/row_groups.py) it costs
only its own tokens' compute, not a second read of the weights, so while others stream a step
may prefill as little as one token, and its share is ``RIDING_SHARE`` (measured on a CPU: at
1.5 decode steps, noise took single gaps to 3.3x); otherwise at least ``MIN_CHUNK``, which a
second pass over the weights makes worth its cost.

Before anything is measured a prompt starts with a few tokens: one cheap step tells the cost.
The fit is trusted up to ``GROWTH`` times the largest step it has seen, so a fit from small
noisy steps never sends a step far past the budget: a fast machine reaches its configured
step within a few steps.
"""

from __future__ import annotations

MIN_CHUNK = 4  # prompt tokens per step at least (one a prompt when many share it), so prompts advance
PREFILL_SHARE = 1.5  # a step's prefill may take this many decode steps: gaps stay under 3x, noise included
RIDING_SHARE = 0.75  # the same for a chunk riding on the decode pass, whose size is finer (a token)
MAX_STEP_S = 1.0  # a step's prefill takes about this long at most: progress and cancels stay live
GROWTH = 4  # a step prefills at most this many times the most tokens measured in one step


class StepTimer:
    """Measures decode steps and prefill calls; sizes the next prefill chunk."""

    def __init__(self, alpha: float = 0.2, share: float = PREFILL_SHARE, max_step_s: float = MAX_STEP_S):
        self.alpha = alpha
        self.share = share
        self.max_step_s = max_step_s
        self.decode_s: float | None = None
        # Decayed sums for the fit of prefill seconds against tokens: weight, x, x², y, xy.
        self._sums = [0.0] * 5
        self._largest = 0  # the most prompt tokens one measured step prefilled
        # Feedback on steps that prefill while others stream: the chunk is scaled by this.
        self.scale = 1.0
        self._target: float | None = None  # the step time the last chunk was sized to fill
        self.riding = False  # set by the scheduler: a chunk beside a decoding batch rides on its pass

    def observe(self, seconds: float, *, decoded: bool, prefilled: int) -> None:
        """One step: how long it took, whether it decoded, how many prompt tokens it prefilled."""
        if prefilled == 0:
            if decoded:
                self.decode_s = (
                    seconds if self.decode_s is None else self.decode_s + self.alpha * (seconds - self.decode_s)
                )
            return
        target, self._target = self._target, None
        if decoded and target:
            # How far the step overran (or fell short of) the time its chunk was sized to fill;
            # square-rooted, so noise moves the scale a little and a steady overrun a lot.
            self.scale = min(max(self.scale / (seconds / target) ** 0.5, 0.05), 2.0)
        spent = seconds - ((self.decode_s or 0.0) if decoded else 0.0)
        if spent <= 0:
            return
        self._largest = max(self._largest, prefilled)
        keep = 1 - self.alpha
        x, y = float(prefilled), spent
        for i, term in enumerate((1.0, x, x * x, y, x * y)):
            self._sums[i] = self._sums[i] * keep + term

    def cost(self) -> tuple[float, float] | None:
        """The fitted (seconds per call, seconds per token) of a prefill call, or None before any."""
        w, sx, sxx, sy, sxy = self._sums
        if w == 0 or sx == 0:
            return None
        det = w * sxx - sx * sx
        if det > 1e-9 * w * sxx:
            per_token = (w * sxy - sx * sy) / det
            per_call = (sy - per_token * sx) / w
            if per_token > 0 and per_call >= 0:
                return per_call, per_token
        return 0.0, sy / sx  # one chunk size seen so far (or a fit that makes no sense): proportional

    def budget_s(self, *, decoding: bool) -> float:
        """Seconds a step's prefill may take: about a second, less while others stream."""
        if decoding and self.decode_s is not None:
            share = min(self.share, RIDING_SHARE) if self.riding else self.share
            return min(self.max_step_s, share * self.decode_s)
        return self.max_step_s

    def chunk(self, max_chunk: int, *, decoding: bool, prompts: int) -> int:
        """Prompt tokens per prefilling sequence this step, never above ``max_chunk``."""
        prompts = max(prompts, 1)
        # A step advances by MIN_CHUNK tokens at least, in all (one when it rides on a decode pass).
        least = max((1 if decoding and self.riding else MIN_CHUNK) // prompts, 1)
        cost = self.cost()
        if cost is None:
            return min(max_chunk, least * 2 if decoding else least)  # one cheap step to measure
        per_call, per_token = cost
        budget = self.budget_s(decoding=decoding)
        fill = (budget - per_call) / per_token * (self.scale if decoding else 1.0)
        tokens = int(min(max(min(fill, GROWTH * self._largest) / prompts, least), max_chunk))
        # Only a chunk the budget sized says something about the budget when its step is timed.
        self._target = (self.decode_s or 0.0) + budget if decoding and tokens * prompts >= int(fill) > 0 else None
        return tokens
