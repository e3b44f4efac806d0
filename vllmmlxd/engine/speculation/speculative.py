"""Speculative decoding inside the continuous batch.

Each step, every sequence of the batch that drafts proposes a few tokens of its own (prompt
lookup: the tokens that followed the latest earlier occurrence of its last few tokens, in its
prompt or its output; or a small draft model of the same tokenizer, run ahead of the row);
one forward pass of the whole batch verifies every sequence's drafts
together, each row fed its pending token and its drafts; each row keeps the drafts its model
agrees with and one token more (the correction, or a bonus when all were accepted). So a step
yields one to ``num_draft + 1`` tokens a sequence, where a plain step yields one.

- **Acceptance**: a row keeps a draft when it is the token the row would have produced there
  itself: the argmax for a greedy request; for a sampled one, the token its sampler draws at
  that position, whose key depends on the request's seed and the position alone
  (``sampling.RequestSampler``). A draft is certain (prompt lookup's tokens; a draft model's
  argmax), so this is speculative rejection sampling with a one-token draft distribution: a
  draft ``d`` is kept with probability ``p(d)``, and otherwise the token drawn is distributed as
  ``p`` without ``d``. Because both draws share the position's key, the output is exactly what
  the request gives without speculation (greedy or seeded), whatever drafts a step verified.
- **Logits processors** (penalties, logit bias, a grammar) run position by position, each fed
  the token before it, and stop at the first rejected draft, so a stateful processor (the
  grammar's matcher, the output penalty's counts) has read exactly the tokens that were kept.
  A grammar also cuts a draft where it would refuse it, before the forward pass.
- **The KV cache** got every draft's position in every row; a row keeps the positions of the
  tokens it accepted. Attention KV: the shared tail is trimmed, and a row that kept fewer is
  shifted right by the difference into its left padding (mlx-lm's ``BatchKVCache`` keeps rows
  left-padded). Sliding windows and recurrent states cannot give a position back: the batch
  puts them as they were before the pass and feeds each row what it kept (``rollback.py``).
- **Adaptive**: a row whose drafts keep failing pauses drafting for a growing number of steps;
  and the step's draft width is the one whose expected tokens per second is highest, from
  each row's acceptance rate (of the drafts it tried) and what this batch's own steps cost,
  timed by the engine's loop (``StepCosts``: a plain step, and a verifying step by its width;
  the prefill fit stands in until measured). So a full batch on a compute-bound machine drafts
  less or not at all, and every few steps the runner-up width runs, to measure it again.

Built on mlx-lm 0.32's ``GenerationBatch`` (its rows, caches, processors and stop matchers),
whose one-token step runs unchanged when no row drafts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, dynamic_roll, make_prompt_cache

from ..batch.layout import RollbackKind
from ..batch.mlxlm import counted, matchers, set_next_logprobs, written
from ..batch.row_groups import GroupedBatch, row_groups
from ..options import SpeculationOptions
from .draft_width import StepCosts, best_width
from .mtp import MTPDrafter
from .rollback import replay, restore, snapshot

PAUSE_AFTER = 3  # drafts rejected whole in a row before a row pauses drafting
MAX_PAUSE = 64  # steps a row pauses at most
PRIOR_ACCEPTANCE = 0.5  # what a row's acceptance is taken to be before it has drafted
PREDICTED_DRAFT = 16  # drafts a step at most from a request's predicted output
EXPLORE_EVERY = 8  # every this-many steps with drafts at hand, the runner-up width runs, to measure it again


def occurrences(tokens: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Where ``pattern`` starts in ``tokens``, in order (none when it is longer)."""
    if len(tokens) < len(pattern):
        return np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, len(pattern))
    return np.flatnonzero((windows == pattern).all(axis=1))


def predicted_drafts(prediction: np.ndarray, written: np.ndarray, ngram: int, k: int) -> list[int]:
    """A predicted output's ``k`` tokens from where the row's output (``written``, the pending
    token not yet in it) stands in it: right after it while the output has kept to the prediction,
    else after the place in the prediction, nearest the output's length, where the output's last
    tokens occur (an edit the prediction did not have, then back on it). The first stands for the
    pending token, as a prompt lookup's does."""
    m = len(written)
    if m <= len(prediction) and np.array_equal(prediction[:m], written):
        return prediction[m : m + k].tolist()
    for n in range(min(ngram, m), 1, -1):  # the longest tail of the output found in the prediction
        found = occurrences(prediction[:-1], written[m - n :])
        if found.size:  # an edit is local: the occurrence nearest the output's own length
            start = int(found[np.argmin(np.abs(found + n - m))]) + n
            return prediction[start : start + k].tolist()
    return []


def lookup_drafts(history: np.ndarray, ngram: int, k: int) -> list[int]:
    """Prompt lookup: the ``k`` tokens that followed an earlier occurrence of the history's last
    ``n`` tokens, for the longest ``n`` from ``ngram`` down to 2 (1 when ``ngram`` is 1) that
    occurs; nothing when none does. Of the occurrences, the latest that is followed by ``k``
    tokens (in a run that repeats, the latest one is followed by only the run's last tokens),
    else the latest."""
    size = len(history)
    for n in range(ngram, min(ngram, 2) - 1, -1):
        if size <= n:
            continue
        found = occurrences(history[: size - 1], history[size - n :])
        if found.size:
            whole = found[found + n + k <= size]
            start = int(whole[-1] if whole.size else found[-1]) + n
            return history[start : start + k].tolist()
    return []


@dataclass
class RowDrafting:
    """One sequence's drafting: whether it drafts, how well it has done, its history (every token
    in its KV), and a draft model's own cache of that history."""

    enabled: bool
    alpha: float = PRIOR_ACCEPTANCE  # recent acceptance of a draft token (moving average)
    misses: int = 0  # drafts rejected whole, one after another
    pause: int = 0  # steps left without drafting
    drafted: int = 0
    accepted: int = 0
    history: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: int = 0
    draft_cache: list[Any] | None = None  # the draft model's KV over history[:draft_len]
    draft_len: int = 0
    prediction: np.ndarray | None = None  # a predicted output's tokens: its drafts come from them
    mtp: Any = None  # the row's multi-token-prediction state (mtp.MTPRow), where the entry drafts so
    prompt_len: int = 0  # where the row's output starts in its history

    def extend(self, tokens: list[int]) -> None:
        """Append to the lookup history (grown by doubling, so appends are amortised)."""
        need = self.size + len(tokens)
        if need > len(self.history):
            grown = np.zeros(max(need, 2 * len(self.history), 256), np.int64)
            grown[: self.size] = self.history[: self.size]
            self.history = grown
        self.history[self.size : need] = tokens
        self.size = need

    def with_pending(self, token: int) -> np.ndarray:
        """The history and the pending token after it (written past the end, not kept)."""
        self.extend([token])
        self.size -= 1
        return self.history[: self.size + 1]

    def record(self, drafted: int, accepted: int, *, pause: bool = True) -> None:
        """How a step's drafts went: the moving acceptance, and a pause after whole rejections."""
        if drafted == 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        # A draft is judged only once those before it were kept: after a rejection the rest were
        # never tried, so the chance that a tried draft is kept is accepted / tried.
        tried = accepted + (1 if accepted < drafted else 0)
        self.alpha += 0.3 * (accepted / tried - self.alpha)
        if accepted:
            self.misses = 0
            return
        self.misses += 1
        if pause and self.misses >= PAUSE_AFTER:
            self.pause = min(2 ** (self.misses - PAUSE_AFTER + 2), MAX_PAUSE)


@dataclass
class SpeculationStats:
    """Counters for status and metrics: written by the engine thread."""

    steps: int = 0  # forward passes that verified drafts
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def token_of(x: mx.array) -> int:
    """An array's one token id (mlx types ``item()`` as any scalar)."""
    return int(cast(int, x.item()))


class DraftModel:
    """A small model of the same tokenizer that drafts ahead of each row, one row at a time.

    A row's draft cache follows its history: it catches up ``CATCH_UP`` tokens a step at most
    (a long prompt is read over several steps, and the row does not draft until it is), then the
    model is run ``k`` tokens ahead, greedily (a certain draft, whatever the request samples).
    After verification the cache is cut back to the tokens the row kept."""

    CATCH_UP = 256

    def __init__(self, model: Any):
        self.model = model

    def propose(self, row: RowDrafting, history: np.ndarray, k: int) -> list[int]:
        if row.draft_cache is None:
            row.draft_cache = make_prompt_cache(self.model)
        behind = len(history) - row.draft_len
        if behind > self.CATCH_UP:  # read a chunk of the history this step; draft once caught up
            chunk = history[row.draft_len : row.draft_len + self.CATCH_UP]
            self.model(mx.array(chunk)[None], cache=row.draft_cache)
            mx.eval([c.state for c in row.draft_cache])
            row.draft_len += len(chunk)
            return []
        feed = mx.array(history[row.draft_len :])[None]
        drafts: list[int] = []
        for _ in range(k):
            token = token_of(mx.argmax(self.model(feed, cache=row.draft_cache)[0, -1]))
            drafts.append(token)
            feed = mx.array([[token]])
        row.draft_len = len(history) + k - 1  # the last draft was proposed, not fed
        return drafts

    def rewind(self, row: RowDrafting, history_len: int) -> None:
        """Cut the row's draft cache back to the first ``history_len`` tokens of its history."""
        if row.draft_cache is not None and row.draft_len > history_len:
            for c in row.draft_cache:
                c.trim(row.draft_len - history_len)
            row.draft_len = history_len

    def observe(self, row: RowDrafting, emitted: list[int], hidden: mx.array) -> None:
        """A draft model reads its rows' tokens itself: nothing to take from the batch's pass."""


class SpeculativeBatch(GroupedBatch):
    """mlx-lm's generation batch, whose step verifies drafts when rows have some."""

    options: SpeculationOptions
    drafter: DraftModel | MTPDrafter | None  # method draft or mtp; None: prompt lookup
    rows: dict[int, RowDrafting]  # by uid; the scheduler adds a row as it inserts it and drops it as it leaves
    stats: SpeculationStats
    costs: StepCosts  # what its own steps cost (timed by the scheduler's loop; the prefill fit before)
    decided: int  # steps that had drafts at hand
    rollback: RollbackKind  # how a rejected draft's positions are undone (layout.CacheLayout.rollback)
    replays: int  # verify passes whose caches were put back and fed again (rollback "replay")

    @classmethod
    def make(
        cls,
        model: Any,
        fallback_sampler: Any,
        options: SpeculationOptions,
        cost: Callable[[], tuple[float, float] | None],
        draft_model: Any = None,
        rollback: RollbackKind = "trim",
    ) -> SpeculativeBatch:
        batch = cls.empty(model, fallback_sampler)
        batch.rollback, batch.replays = rollback, 0
        batch.options, batch.rows, batch.stats = options, {}, SpeculationStats()
        batch.costs, batch.decided = StepCosts(cost), 0
        batch.drafter = None
        if isinstance(draft_model, MTPDrafter):  # the batch's passes keep the hidden states it drafts from
            batch.drafter, batch.model = draft_model, draft_model.tap(batch.model)
        elif draft_model is not None:
            batch.drafter = DraftModel(draft_model)
        return batch

    @property
    def step_tokens(self) -> int:
        """The most tokens a row may keep in one step: its widest drafts and one more."""
        return 1 + max(self.options.num_draft, PREDICTED_DRAFT)

    def next(self) -> list:
        if not self.uids:
            return []
        plan = self._plan()
        self.costs.last = (len(self.uids), 0 if plan is None else plan[1])
        if plan is None:
            if self.drafter is not None:  # drafts proposed and not verified: their tokens are not the rows'
                for drafting in self.rows.values():
                    self.drafter.rewind(drafting, drafting.size + 1)
            order = {uid: i for i, uid in enumerate(self.uids)}
            responses = super().next()
            hidden = getattr(self.model, "hidden", None)
            if self.drafter is not None and hidden is not None:
                for r in responses:
                    row = self.rows.get(r.uid)
                    if row is not None and row.enabled:
                        self.drafter.observe(row, [r.token], hidden[order[r.uid]])
            for r in responses:  # keep the lookup history of rows that may draft later
                row = self.rows.get(r.uid)
                if row is not None and row.enabled and row.size:  # (an empty one is read whole when it drafts)
                    row.extend([r.token])
            return responses
        return self._verify(*plan)

    # -- deciding -------------------------------------------------------------------------

    def _plan(self) -> tuple[list[list[int]], int] | None:
        """Each row's drafts and the step's width; None: a plain step.

        Prompt lookup does not wait for the pending tokens (the batch computes them ahead, while
        the last step's tokens are handled): it looks up each row's history as it stands, and the
        match's first token stands for the pending one (when it is not, the drafts after it fail
        verification like any wrong draft). So a step that finds nothing to draft is mlx-lm's
        own, still computed ahead. A draft model runs from the pending token: it waits for it."""
        rows = [self.rows.get(uid) for uid in self.uids]
        if self.primed or not any(r is not None and r.enabled for r in rows):
            return None  # (a row that just joined has its first pass in a plain step: row_groups)
        pending: list[int | None] = [None] * len(rows)
        if self.drafter is not None:
            mx.eval(self._next_tokens)
            pending = cast(list[int | None], cast(mx.array, self._next_tokens).tolist())
        drafts = [self._propose(i, row, pending[i]) for i, row in enumerate(rows)]
        alphas = [r.alpha if r is not None else 0.0 for r in rows]
        width = max((len(d) for d in drafts), default=0)
        if self.options.adaptive and width:
            widths, cost = [len(d) for d in drafts], self.costs.cost(len(rows))
            width = best_width(widths, alphas, cost)
            # Now and then the runner-up runs instead: costs drift (a busy machine, a longer
            # context), and a width measured once in a slow moment would otherwise never be again.
            self.decided += 1
            if self.decided % EXPLORE_EVERY == 0:
                width = best_width(widths, alphas, cost, avoid=width)
        if width == 0:
            return None
        return [d[:width] for d in drafts], width

    def _propose(self, i: int, row: RowDrafting | None, pending: int | None) -> list[int]:
        """Row ``i``'s drafts for the positions after its pending token (``pending``: None when
        not known yet, for prompt lookup)."""
        if row is None or not row.enabled:
            return []
        if row.size == 0:  # first step in this batch: the row's whole history so far
            row.extend(self.tokens[i])
        if row.pause:
            row.pause -= 1
            return []
        room = self.max_tokens[i] - counted(self)[i] - 1  # the pending token is one of them
        # A prediction is long runs of likely tokens (an edit's unchanged text): it drafts wider.
        k = min(
            max(self.options.num_draft, PREDICTED_DRAFT) if row.prediction is not None else self.options.num_draft, room
        )
        if k <= 0:
            return []
        if self.drafter is not None and row.prediction is None:
            assert pending is not None  # a draft model waits for it
            drafts = self.drafter.propose(row, row.with_pending(pending), k)
        else:
            if row.prediction is not None:
                written = row.history[row.prompt_len : row.size]
                found = predicted_drafts(row.prediction, written, self.options.ngram, k + 1)
            else:
                found = lookup_drafts(row.history[: row.size], self.options.ngram, k + 1)
            if len(found) < 2:
                return []
            pending, drafts = found[0], found[1:]  # the match's first token stands for the pending one
        for processor in self._processors(i):
            cut = getattr(processor, "acceptable", None)
            if cut is not None and drafts:
                drafts = drafts[: max(cut([pending, *drafts]) - 1, 0)]
        return drafts

    # -- verifying ------------------------------------------------------------------------

    def _verify(self, drafts: list[list[int]], width: int) -> list:
        rows = len(self.uids)
        padded = mx.array([[*d, *([0] * (width - len(d)))] for d in drafts], dtype=mx.uint32)
        inputs = mx.concatenate([cast(mx.array, self._next_tokens).astype(mx.uint32)[:, None], padded], axis=1)
        saved = snapshot(self.prompt_cache) if self.rollback == "replay" else None
        logits = self.model(inputs, cache=self.prompt_cache)
        hidden = getattr(self.model, "hidden", None)  # (a drafter's tap: read before a replay's pass)
        mx.eval(logits, inputs)
        pending = cast(list[int], inputs[:, 0].tolist())
        self._current_tokens = cast(Any, inputs[:, 0])
        emitted, following = [], []
        for i in range(rows):
            kept, nxt = self._accept(i, inputs[i], logits[i], drafts[i])
            emitted.append([pending[i], *drafts[i][:kept]])
            following.append(nxt)
            row = self.rows.get(self.uids[i])
            if row is not None:
                row.record(len(drafts[i]), kept, pause=self.options.adaptive)
            self.stats.drafted += len(drafts[i])
            self.stats.accepted += kept
        self.stats.steps += 1
        finish = [self._finish(i, emitted[i]) for i in range(rows)]  # may shorten emitted rows
        if saved is None:
            self._trim([len(e) for e in emitted], width + 1)
        elif any(len(e) < width + 1 for e in emitted):  # a row kept fewer positions than the pass wrote
            restore(saved)
            replay(self.model, self.prompt_cache, emitted)
            self.replays += 1
        if self.drafter is not None:  # each row's drafter back to what the row kept
            for i, row in enumerate(self.rows.get(uid) for uid in self.uids):
                if row is None or not row.enabled:
                    continue
                self.drafter.rewind(row, row.size + len(emitted[i]))
                if hidden is not None:
                    self.drafter.observe(row, emitted[i], hidden[i])
        self._next_tokens = cast(Any, mx.array(following, dtype=mx.uint32))
        set_next_logprobs(self, [logits[i, len(emitted[i]) - 1] for i in range(rows)])
        responses, keep = [], []
        for i in range(rows):
            self.tokens[i].extend(emitted[i])
            row = self.rows.get(self.uids[i])
            if row is not None and row.enabled:
                row.extend(emitted[i])
            for j, token in enumerate(emitted[i]):
                last = j == len(emitted[i]) - 1
                reason = finish[i] if last else None
                responses.append(
                    self.Response(
                        uid=self.uids[i],
                        token=token,
                        logprobs=logits[i, j],
                        finish_reason=reason,
                        prompt_cache=self.extract_cache(i) if reason else None,
                        all_tokens=self.tokens[i] if reason else None,
                    )
                )
            if finish[i] is None:
                keep.append(i)
        if len(keep) < rows:
            self.filter(keep)
        return responses

    def _accept(self, i: int, inputs: mx.array, logits: mx.array, drafts: list[int]) -> tuple[int, int]:
        """How many of row ``i``'s drafts it keeps, and the token after them: at each position, the
        token the row produces there itself (its processors fed the token before it), until one
        differs from the draft."""
        sampler: Any = (self.samplers[i] if self.samplers else None) or self.fallback_sampler
        processors = self._processors(i)
        greedy = getattr(sampler, "greedy", False) or sampler is self.fallback_sampler
        n = len(drafts)
        if greedy and not processors:
            targets = cast(list[int], mx.argmax(logits[: n + 1], axis=-1).tolist())
            kept = next((j for j in range(n) if targets[j] != drafts[j]), n)
            return kept, targets[kept]
        first = counted(self)[i] + 1  # the position of the token after the pending one
        for j in range(n + 1):
            scores = logits[j : j + 1]
            if processors:
                context = self._token_context[i].update_and_fetch(inputs[j : j + 1])
                for processor in processors:
                    scores = processor(context, scores)
            logprobs = scores - mx.logsumexp(scores, axis=-1, keepdims=True)
            token = token_of(mx.argmax(logprobs, axis=-1) if greedy else sampler.at(logprobs, first + j))
            if j == n or token != drafts[j]:
                if not greedy:
                    sampler.drawn = first + j + 1  # the plain step's next draw is the position after
                return j, token
        raise AssertionError("unreachable: the loop returns at its last position")

    def _processors(self, i: int) -> tuple:
        return tuple(self.logits_processors[i] or ()) if self.logits_processors else ()

    def _finish(self, i: int, emitted: list[int]) -> str | None:
        """Counts row ``i``'s tokens and runs its stop matcher over them; a row that finishes
        keeps only the tokens up to the one that finished it (``emitted`` is shortened)."""
        counts, stops = counted(self), matchers(self)
        for j, token in enumerate(emitted):
            counts[i] += 1
            reason = None
            if counts[i] >= self.max_tokens[i]:
                reason = "length"
            if stops[i].advance(token):
                reason = "stop"
            if reason is not None:
                del emitted[j + 1 :]
                return reason
        return None

    def _trim(self, keep: list[int], written: int) -> None:
        """Each row keeps its first ``keep[i]`` of the ``written`` positions the step wrote."""
        for layer in self.prompt_cache:
            for cache, rows in row_groups(layer):
                assert isinstance(cache, BatchKVCache)  # layout.CacheLayout.speculation: plain attention
                _trim_rows(cache, [written - k for k in keep[rows]])


def _trim_rows(cache: BatchKVCache, extra: list[int]) -> None:
    """Drop the last ``extra[i]`` written positions of each row of ``cache``."""
    shared = min(extra)
    if shared:
        cache.trim(shared)
    more = [e - shared for e in extra]
    if any(more):
        shift = mx.array(more)
        end = written(cache)  # the rows' written positions; the buffer past it is spare
        keys, values = cast(mx.array, cache.keys), cast(mx.array, cache.values)
        keys[..., :end, :] = dynamic_roll(keys[..., :end, :], shift[:, None], axis=2)
        values[..., :end, :] = dynamic_roll(values[..., :end, :], shift[:, None], axis=2)
        cache.left_padding = cache.left_padding + shift
        cache.offset = cache.offset - shift
