"""The engine thread: continuous batching over mlx-lm's BatchGenerator, with a prefix cache.

Requests arrive as :class:`Sequence` objects. Each step, sequences whose client went away
leave the batch, waiting ones join it (up to ``max_running``; each first takes the longest
start of its prompt from the prefix cache), and the batch advances by one decode step
plus one chunk of every prompt still being prefilled (for the families ``row_groups`` covers,
in one pass, rows keeping their KV in groups). Finished sequences leave their KV in the
prefix cache, a few blocks a step (``store_queue``). The events of a step are posted to the
asyncio loop in one call.

mlx-lm's BatchGenerator brings what is hard to get right (per-sequence samplers and logits
processors, batched KV caches with padding, insert/remove at any step); two things it lacks
are written here: the prefill chunk is sized each step from measured speeds so a step
takes about a second at most and a long prompt does not stall running streams
(``step_timer``; its progress shows and a cancel is heard chunk by chunk), and a prompt that
shares a long start with one being prefilled waits for it, so it reuses that prefill from
the cache.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections import deque
from dataclasses import replace
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator, StopSequences

from ..log import log_event
from .batch_rows import row_layers
from .cache_setup import make_prefix_cache
from .checkpoints import Captures, checkpoint_positions, segments
from .constraint import Grammars
from .grouped_attention import wrap_attention
from .kv_budget import GROWTH_STEP, KvBudget, KvLayout, LayerKv
from .kv_probe import probe_layout
from .layout import read_layout
from .lockstep import IDLE_FRAME_S, Lockstep
from .options import EngineOptions
from .prefix_cache import PromptCache, common_prefix
from .row_groups import GroupedBatch, GroupedModel, RidingPrompts, groupable
from .sampling import make_processors, make_sampler
from .sequence import Sequence
from .speculative import RowDrafting, SpeculativeBatch
from .step_timer import StepTimer
from .store_queue import StoreQueue
from .types import EngineStats, FinishReason, WaitingFor
from .upstream_fixes import apply_all as apply_upstream_fixes
from .vision_prefill import EmbeddingPrefill, Staged

logger = logging.getLogger("vllmmlxd.engine")

SHARED_PREFIX_WAIT = 64  # tokens in common with a prompt being prefilled that make a request wait for it
PREFILL_BATCH = 8  # prompts prefilled together at most


class Scheduler:
    """Owns the model's batch; only its thread touches mlx."""

    grammars: Grammars | None = None  # set by the engine: makes a constrained request's processor

    def __init__(
        self,
        model: Any,
        eos_ids: set[int],
        options: EngineOptions,
        stats: EngineStats,
        lockstep: Lockstep | None = None,
        vision: Any = None,
        draft: Any = None,
        cache: PromptCache | None = None,
    ):
        apply_upstream_fixes()  # mlx-lm bugs carried here until mlx-lm has the fix (upstream_fixes.py)
        self.model = model
        self.draft = draft  # speculative: the draft model, with method draft
        self.eos_ids = eos_ids
        self.options = options
        self.stats = stats
        # A sharded model's other ranks replay what changes the batch (engine/lockstep.py).
        self.lockstep = lockstep or Lockstep()
        # What the model's layers keep between tokens, read once: the features below branch on it.
        self.layout = read_layout(model)
        # Blocks or whole sequences (cache_setup.py); the engine brings one with a disk tier.
        self.cache = (
            cache
            if cache is not None
            else make_prefix_cache(model, options, distributed=self.lockstep.distributed, layout=self.layout)
        )
        # A layered model's blocks need what a row's windowed and recurrent layers held on its way.
        self.layered = getattr(self.cache, "layered", None) if self.cache.enabled else None
        self.cache.on_drop = self.lockstep.dropped
        self.inbox: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        # A vision model's prompts with images left to prefill, before they join the batch.
        self.vision = EmbeddingPrefill(model, vision) if vision is not None else None
        self.staged: list[Staged] = []
        self.timer = StepTimer()
        self.on_admit = lambda seq: None  # the engine's admission counter
        self.spec: SpeculativeBatch | None = None  # the batch's drafting, when the entry speculates
        self.gen = self._new_generator()
        # Admission by KV bytes (kv_budget.py); the engine sets the default limit and swaps in live changes.
        self.kv = self._kv_budget()
        # Finished sequences' KV goes into the block cache a few blocks a step (store_queue.py);
        # a sharded entry's ranks store in lockstep, at once, as does the whole-sequence cache.
        block = getattr(self.cache, "block", None)
        self.stores = StoreQueue(self._insert_kv, block) if block and not self.lockstep.distributed else None
        self._retired: list[Sequence] = []  # finished this step, events not posted yet
        self._generated = 0  # tokens generated since start, for the recent rate
        self.clock = time.perf_counter  # times steps for the step timer (a test's fake model brings its own)

    def _new_generator(self) -> BatchGenerator:
        # Rows that join keep their KV apart: the pass written out for the plain decoders
        # (row_groups.py), else each attention module group by group in the model's own pass
        # (grouped_attention.py). A sharded model runs its own layers; a vision model's prompts
        # are staged apart.
        own = not self.lockstep.distributed and self.vision is None
        written = own and groupable(self.model)
        grouping = written or (own and wrap_attention(self.model, self.layout))
        self.grouping, self.riding = grouping, written
        gen = BatchGenerator(
            cast(Any, GroupedModel(self.model, written=written)) if grouping else self.lockstep.wrap(self.model),
            completion_batch_size=self.options.max_running,
            prefill_batch_size=min(self.options.max_running, PREFILL_BATCH),
            prefill_step_size=self.options.prefill_step_size,
        )
        speculative = self.options.speculative
        # Followers replay rank 0's batch token by token: a sharded entry does not speculate.
        if speculative is not None and not self.lockstep.distributed and self.layout.speculation() is None:
            self.spec = SpeculativeBatch.make(gen.model, gen.sampler, speculative, self.timer.cost, self.draft)
            self.spec.grouping = grouping
            gen._generation_batch = self.spec  # mlx-lm's generator keeps this batch for its life
        elif grouping:
            batch = GroupedBatch.empty(gen.model, gen.sampler)
            batch.grouping = True
            gen._generation_batch = batch
        self.timer.riding = written
        if written:  # a prompt's chunk rides on the batch's pass (row_groups.RidingPrompts)
            prompts = RidingPrompts.empty(gen.model, gen.sampler, prefill_step_size=self.options.prefill_step_size)
            prompts.decoding = lambda: len(gen._generation_batch) > 0
            gen._prompt_batch = prompts
        return gen

    def features(self) -> dict:
        """What the engine does for this model's layout, and why not where it does not (the
        ``layout`` block of /v1/status): its batch's layout, its prefix cache, speculation."""
        spec_off = self.layout.speculation()
        if self.lockstep.distributed:
            spec_off = "a sharded entry's followers replay rank 0's batch token by token"
        kind = self.layered.cache_layout.prefix_cache(self.layered.block) if self.layered is not None else None
        cache = getattr(self.cache, "block", None)
        return {
            **self.layout.describe(),
            "batching": (
                "row groups, prompt chunks riding on the decode pass"
                if self.riding
                else "row groups"
                if self.grouping
                else "one padded batch"
            ),
            "prefix_cache": kind or ("blocks" if cache else "sequences"),
            "speculation": None if spec_off is None else {"off": spec_off},
        }

    def _kv_budget(self) -> KvBudget:
        """The model's KV layout (and its draft model's, which keeps a cache a row), and the
        entry's explicit limit; no limit when the layout cannot be read."""
        try:
            layers = probe_layout(self.model).layers
            layout: KvLayout | None = self._captured(layers)
            if self.spec is not None and self.draft is not None:
                assert layout is not None
                layout = replace(layout, layers=layout.layers + probe_layout(self.draft).layers)
        except Exception as exc:  # a family whose cache cannot be made outside a batch: admitted by count only
            log_event(logger, "kv.layout_unknown", logging.WARNING, error=repr(exc))
            layout = None
        # A verify step writes every draft position before it trims the rejected ones.
        slack = GROWTH_STEP + (
            self.options.speculative.num_draft if self.spec is not None and self.options.speculative else 0
        )
        budget = KvBudget(layout, slack=slack)
        if self.options.kv_budget_bytes is not None:
            budget = budget.with_limit(self.options.kv_budget_bytes, self.options.kv_budget_source)
        return budget

    def _captured(self, layers: tuple[LayerKv, ...]) -> KvLayout:
        """``layers``, and what a layered model's prompt holds on its way into the prefix cache
        (``checkpoints.Captures``): each windowed layer's KV of every position, and the
        recurrent state's checkpoints."""
        if self.layered is None or len(layers) != len(self.layout.layers):
            return KvLayout(layers)
        kinds = [spec.kind for spec in self.layout.layers]
        windows = tuple(LayerKv(layer.per_token) for layer, kind in zip(layers, kinds) if kind == "window")
        state = sum(layer.fixed for layer, kind in zip(layers, kinds) if kind == "state")
        return KvLayout(layers + windows, checkpoint_bytes=state, block=self.layered.block)

    # -- the thread -------------------------------------------------------

    def run(self) -> None:
        """The engine thread: serve what arrives in ``inbox`` until ``None`` does."""
        if self.lockstep.distributed:
            # Every collective of a rank on one thread and stream: the warm-up too.
            log_event(logger, "engine.warm", seconds=round(self.warm_up(), 2))
        while True:
            if not self.running and not self.waiting and not self.staged:
                item = self._wait()
                if item is None:
                    break
                self.stats.last_step_at = time.monotonic()  # idle until now: not a stalled step
                self.waiting.append(item)
            if not self.step():
                break
        self.shutdown()

    def _wait(self) -> Sequence | None:
        """The next request; the other ranks of a sharded model hear from this one while it waits."""
        if not self.lockstep.distributed:
            return self.inbox.get()
        while True:
            try:
                return self.inbox.get(timeout=IDLE_FRAME_S)
            except queue.Empty:
                self.lockstep.idle()
                self.stats.last_frame_at = time.monotonic()

    def step(self) -> bool:
        """One round: take new requests, drop the cancelled, admit, advance the batch, post events.

        Returns False once the inbox asked the engine to stop. A round does one decode step and
        one bounded prefill chunk, so a cancel is seen at the next round, within one chunk.
        """
        stopping = self._drain_inbox()
        self.cache.begin_step()  # the blocks the last step's lookups used may be evicted again
        self._drop_cancelled()
        # A request about to be admitted may want what they hold; and their KV, no longer reserved,
        # is in the prefix cache's budget before another request's reservation takes its place.
        if self.stores and self.waiting:
            self.stores.advance(everything=True)
        self._admit()
        if self.running or self.staged:
            self._step()
            self._note_kv_held()
        if self.stores:  # off the critical step: a few blocks while others stream, the rest when idle
            self.stores.advance(everything=not self.running and not self.staged)
        self._post()
        return not stopping

    def shutdown(self) -> None:
        """End every request still here (cancelled) and post their last events."""
        for seq in [*self.waiting, *self.running.values(), *(s.seq for s in self.staged)]:
            seq.finish("cancelled")
        self.waiting.clear()
        self.staged.clear()
        self._post()
        self.lockstep.stop()
        self.cache.close()  # the disk writer finishes what it was handed

    def _drain_inbox(self) -> bool:
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return False
            if item is None:
                return True
            self.waiting.append(item)

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.waiting if s.request.cancelled.is_set()]:
            self.waiting.remove(seq)
            self.on_admit(seq)
            self._retire(seq, "cancelled")
        for seq in [s for s in self.running.values() if s.request.cancelled.is_set()]:
            self._leave(seq, "cancelled", keep_kv=seq.progress.first_token_at is not None)
        for staged in [s for s in self.staged if s.seq.request.cancelled.is_set()]:
            self.staged.remove(staged)
            self._retire(staged.seq, "cancelled")

    def _admit(self) -> None:
        """Move waiting sequences into the batch, oldest first, while there is room: a row free
        (``max_num_seqs``) and its KV within the budget. A sequence whose KV does not fit yet
        stops the queue there, so smaller ones behind it never overtake it for good."""
        prefilling = [s for s in self.running.values() if s.progress.first_token_at is None]
        prefilling += [s.seq for s in self.staged]
        budget = self.kv  # read once: a live change swaps the whole budget
        widths = self._kv_widths(budget)
        blocked: WaitingFor | None = None  # why the rest of the queue waits
        behind_prefix: set[int] = set()  # ids of sequences waiting for a shared prompt's prefill
        for seq in list(self.waiting):
            if len(self.running) + len(self.staged) >= self.options.max_running:
                blocked = "max_num_seqs"
                break
            leader = _shared_prefix_leader(seq, prefilling) if self.cache.enabled else None
            if leader is not None:
                leader.prompt_wanted = True  # cache its prompt as soon as it is prefilled
                behind_prefix.add(id(seq))
                continue
            width = budget.width(len(seq.prompt), seq.request.sampling.max_tokens)
            verdict = budget.verdict(widths, width)
            if verdict == "waits":
                blocked = "kv_budget"
                break
            self.waiting.remove(seq)
            self.on_admit(seq)
            if verdict == "never":  # the budget was lowered while it waited (the API refuses it before)
                refusal = budget.refusal(len(seq.prompt), seq.request.sampling.max_tokens)
                self._retire(seq, "error", refusal, kind="kv_budget")
                continue
            try:
                self._insert(seq)
            except Exception as exc:  # a bad request must not take the batch down
                log_event(logger, "engine.error", logging.ERROR, request_id=seq.request.request_id, error=repr(exc))
                self._retire(seq, "error", str(exc))
                continue
            widths.append(width)
            prefilling.append(seq)
        self._note_queue(blocked, behind_prefix)

    def _kv_widths(self, budget: KvBudget) -> list[int]:
        """The widths (tokens) the admitted sequences reserve: those in the batch and those staged."""
        admitted = [*self.running.values(), *(s.seq for s in self.staged)]
        return [budget.width(len(s.prompt), s.request.sampling.max_tokens) for s in admitted]

    def _note_queue(self, blocked: WaitingFor | None, behind: set[int]) -> None:
        """Each waiting request's place in the queue and what holds it there (``blocked``: what
        stopped admission this round); read by /v1/status."""
        for position, seq in enumerate(self.waiting, 1):
            seq.progress.queue_position = position
            seq.progress.waiting_for = "shared_prefix" if id(seq) in behind else blocked

    def _insert(self, seq: Sequence) -> None:
        hit = self.cache.lookup(seq.prompt_key)
        seq.start(hit.cached_tokens, hit.hit_type)
        seq.shared = hit.shared
        if self.vision is not None and self.vision.needed(seq, hit.cached_tokens):
            self.staged.append(self.vision.stage(seq, hit.cache, hit.cached_tokens))
        else:
            self._join(seq, hit.cache, hit.cached_tokens, hit.source)

    def _join(self, seq: Sequence, cache: list | None, cached: int, source: tuple[int, ...]) -> None:
        """Put ``seq`` in the batch, its first ``cached`` tokens' KV in ``cache`` (joined from the
        prefix cache's ``source`` entry or blocks; empty when it was prefilled elsewhere)."""
        prompt, params = seq.prompt, seq.request.sampling
        stops = StopSequences(None if params.ignore_eos else [[t] for t in sorted(self.eos_ids)])
        processors = make_processors(params)
        if seq.request.constraint is not None:
            if self.grammars is None:
                raise ValueError("constrained decoding is not available")
            # Last: a logit bias after the grammar's mask could re-enable a forbidden token.
            processors.append(self.grammars.processor(seq.request.constraint, seq.request.request_id, prompt))
        (uid,) = self.gen.insert_segments(
            [self._segments(seq, cached)],
            max_tokens=[params.max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[list(prompt[:cached])],
            samplers=[make_sampler(params)],
            logits_processors=[processors],
            stop_sequences=[stops],
        )
        self.lockstep.inserted(uid, list(prompt[cached:]), cached, list(source) or None, params.max_tokens)
        seq.uid, seq.base = uid, cached
        self.running[uid] = seq
        if self.spec is not None:
            self.spec.rows[uid] = RowDrafting(enabled=params.speculative)

    def _segments(self, seq: Sequence, cached: int) -> list[list[int]]:
        """The prompt's uncached tokens, split where a layered model checkpoints its state."""
        if self.layered is None:
            return [seq.prompt[cached:]]
        positions: list[int] = []
        if self.layered.states:
            positions = checkpoint_positions(cached, len(seq.prompt), self.layered.block, seq.shared or None)
        seq.captures = Captures(checkpoints=frozenset(positions))
        return segments(seq.prompt, cached, positions)

    def _capture(self, prompt_responses: list) -> None:
        """What the rows being prefilled hold in their windowed and recurrent layers now (a layered
        model's blocks are cut from it when the sequence is stored)."""
        layered = self.layered
        if layered is None:
            return
        for response in prompt_responses:
            seq = self.running.get(response.uid)
            if seq is None or seq.captures is None:
                continue
            got = row_layers(self.gen, response.uid, (*layered.windows, *layered.states))
            if got is not None:
                layered.capture(got[1], got[0], seq.captures)

    def _capture_decoding(self, seq: Sequence) -> None:
        """A long answer's windowed KV, before it leaves the window: its blocks, every so often
        (the window less a block: each block is whole in the window at one of these steps)."""
        layered = self.layered
        assert layered is not None and seq.uid is not None
        windows = [layered.cache_layout.layers[i].window or 0 for i in layered.windows]
        if not windows:
            return
        every = max(layered.block, (min(windows) - layered.block) // layered.block * layered.block)
        if seq.produced % every:
            return
        got = row_layers(self.gen, seq.uid, layered.windows)
        if got is not None:
            layered.capture_windows(got[1], seq.captures)

    def _advance_staged(self, budget: int) -> tuple[int, bool, list[tuple[Sequence, int]]]:
        """A chunk of ``budget`` positions of every prompt prefilled from embeddings (the step
        timer's share of a prefilling sequence), or, for one of them at most, an image through
        the vision tower; those done join the batch. Returns (positions prefilled, whether the
        tower ran, each prompt's new progress: published with the step's count)."""
        assert self.vision is not None  # only a vision model stages prompts
        total, tower, progress = 0, False, []
        for staged in list(self.staged):
            seq = staged.seq
            try:
                done, ran = self.vision.advance(staged, budget, tower=not tower)
                total, tower = total + done, tower or ran
                progress.append((seq, staged.pos))
                if staged.pos >= staged.end:
                    self.staged.remove(staged)
                    self._join(seq, staged.cache, staged.pos, ())
            except Exception as exc:  # one bad image must not take the batch down
                log_event(logger, "engine.error", logging.ERROR, request_id=seq.request.request_id, error=repr(exc))
                if staged in self.staged:
                    self.staged.remove(staged)
                self._retire(seq, "error", str(exc))
        return total, tower, progress

    def _step(self) -> None:  # noqa: C901 - the step loop, until the step plan replaces it (issue 38)
        prompts = sum(1 for s in self.running.values() if s.progress.first_token_at is None) + len(self.staged)
        decoding = len(self.running) + len(self.staged) > prompts
        self.gen.prefill_step_size = self.timer.chunk(
            self.options.prefill_step_size, decoding=decoding, prompts=prompts
        )
        self.lockstep.step(self.gen.prefill_step_size)
        riding = _riding(self.gen)
        if riding is not None:
            riding[0].rode = riding[1].deferred = 0
        started = self.clock()
        if self.spec is not None:  # times the step before this one (speculative.StepCosts)
            self.spec.costs.lap(started)
        staged, tower = 0, False
        staged_progress: list[tuple[Sequence, int]] = []
        try:
            if self.staged:
                with mx.stream(self.gen.stream):
                    staged, tower, staged_progress = self._advance_staged(self.gen.prefill_step_size)
            prompt_responses, responses = self.gen.next()
        except Exception as exc:  # e.g. out of memory: every sequence of the batch fails, the engine lives on
            log_event(logger, "engine.error", logging.ERROR, running=len(self.running), error=repr(exc))
            if self.lockstep.distributed:
                raise  # the other ranks are mid-step: only a restart of every rank recovers
            for lost in list(self.running.values()):
                self._retire(lost, "error", str(exc))
            self.running.clear()
            self.gen = self._new_generator()
            return
        self.lockstep.finished([r.uid for r in responses if r.finish_reason is not None])
        with self.stats.lock:
            self.stats.steps_executed += 1
            for joining, pos in staged_progress:
                joining.progress.prefilled_tokens = pos
            prefilled = self._note_prefill(prompt_responses) + staged
        self._capture(prompt_responses)
        self._cache_prompts(prompt_responses)
        took = self.clock() - started
        if self.spec is not None:
            alone = not prefilled and not prompt_responses and not self.staged
            self.spec.costs.ended(alone=alone and not any(r.finish_reason for r in responses))
        self.stats.last_step_s = took
        if self.lockstep.distributed:
            self.stats.last_frame_at = time.monotonic()
        # A chunk riding on a pass runs a step after its progress shows.
        ran = prefilled - riding[1].deferred + riding[0].rode if riding is not None else prefilled
        if not tower:  # a vision tower's step says nothing of what a decode step or a chunk costs
            self.timer.observe(took, decoded=bool(responses), prefilled=ran)
        self.stats.last_step_at = time.monotonic()  # read by /health's liveness check
        self._generated += len(responses)
        self.stats.generated.note(time.monotonic(), self._generated)
        for response in responses:
            seq = self.running.get(response.uid)
            if seq is None:
                continue
            reason = self._feed(seq, response.token)
            if response.finish_reason is not None:
                reason = reason or ("length" if response.finish_reason == "length" else "stop")
                self.running.pop(response.uid)
                self._store(seq, response.all_tokens, response.prompt_cache)
                self._retire(seq, reason)
            elif reason is not None:
                self._leave(seq, reason, keep_kv=True)
            elif seq.captures is not None:
                self._capture_decoding(seq)
        if self.spec is not None:  # each request's drafting so far, for /v1/status
            for uid, seq in self.running.items():
                row = self.spec.rows.get(uid)
                if row is not None:
                    seq.progress.drafted_tokens, seq.progress.accepted_tokens = row.drafted, row.accepted

    def _note_kv_held(self) -> None:
        """The KV bytes the batch really holds after a step (its buffers' sizes: nothing is evaluated),
        and the most it held, beside what admission reserved."""
        held = self.gen.prompt_cache_nbytes + sum(_nbytes(s.cache) for s in self.staged)
        if self.spec is not None:
            held += sum(_nbytes(row.draft_cache) for row in self.spec.rows.values())
        self.stats.kv_held_bytes = held
        self.stats.kv_peak_held_bytes = max(self.stats.kv_peak_held_bytes, held)

    def _feed(self, seq: Sequence, token: int) -> FinishReason | None:
        """One token to ``seq``, timed for the TTFT and inter-token histograms."""
        previous = seq.progress.last_token_at
        reason = seq.feed(token)
        progress = seq.progress
        assert progress.first_token_at is not None and progress.last_token_at is not None  # fed: both set
        if previous is None:
            self.stats.ttft.observe(progress.first_token_at - progress.queued_at)
        else:
            self.stats.inter_token.observe(progress.last_token_at - previous)
        return reason

    def _note_prefill(self, prompt_responses: list) -> int:
        """Record prompt progress. Returns tokens prefilled."""
        total = 0
        for response in prompt_responses:
            seq = self.running.get(response.uid)
            if seq is None:
                continue
            done = seq.base + response.progress[0]
            total += max(done - seq.progress.prefilled_tokens, 0)
            seq.progress.prefilled_tokens = done
        return total

    def _cache_prompts(self, prompt_responses: list) -> None:
        """Cache each prompt as soon as it is prefilled, where a waiting request needs it."""
        for response in prompt_responses:
            seq = self.running.get(response.uid)
            if seq is None:
                continue
            # Copying a long prompt's KV takes a while: only when a waiting request needs it now
            # (otherwise the whole sequence is cached when it finishes).
            if response.end_of_prompt and seq.prompt_wanted and self.cache.enabled:
                got = self.gen.extract_cache([response.uid]).get(response.uid)
                self.lockstep.extracted([response.uid])
                if got is not None:
                    self._store(seq, got[1], got[0])

    def _leave(self, seq: Sequence, reason: FinishReason, *, keep_kv: bool) -> None:
        """Take ``seq`` out of the batch now (its KV goes to the prefix cache when asked)."""
        assert seq.uid is not None  # only a running sequence leaves the batch
        self.running.pop(seq.uid, None)
        keep = keep_kv and self.cache.enabled
        try:
            got = self.gen.remove([seq.uid], return_prompt_caches=keep)
        except Exception as exc:
            log_event(logger, "engine.error", logging.ERROR, request_id=seq.request.request_id, error=repr(exc))
            if self.lockstep.distributed:
                raise  # the other ranks would keep a sequence this one lost
            got = {}
        self.lockstep.removed([seq.uid], keep)
        if seq.uid in got:
            cache, tokens = got[seq.uid]
            self._store(seq, tokens, cache)
        self._retire(seq, reason)

    def _store(self, seq: Sequence, tokens: list[int] | None, cache: list | None) -> None:
        if not tokens or not cache or not self.cache.enabled:
            return
        assert seq.uid is not None  # only what ran in the batch has KV to keep
        if self.stores is not None:
            self.stores.add(seq.cache_key(tokens), cache, seq.captures)
            return
        uid = seq.uid
        try:
            pieces = self._insert_kv(seq.cache_key(tokens), cache, seq.captures)
        except Exception as exc:  # the cache is an optimisation: never fail a request over it
            log_event(logger, "cache.error", logging.WARNING, error=repr(exc))
            if self.lockstep.distributed:
                raise  # entries dropped on the way were dropped on every rank: the ranks disagree now
            return
        if pieces:
            self.lockstep.stored(uid, pieces)

    def _insert_kv(self, key: list[int], cache: list, captures: Captures | None = None) -> Any:
        if captures is not None:  # a layered model's block cache: what the sequence captured on its way
            return self.cache.insert(key, cache, owned=True, captures=captures)  # type: ignore[call-arg]
        return self.cache.insert(key, cache, owned=True)  # extracted: fresh copies

    def _retire(
        self, seq: Sequence, reason: FinishReason, error: str | None = None, *, kind: str | None = None
    ) -> None:
        if self.spec is not None and seq.uid is not None:
            row = self.spec.rows.pop(seq.uid, None)
            if row is not None:
                seq.progress.drafted_tokens, seq.progress.accepted_tokens = row.drafted, row.accepted
        seq.finish(reason, error, kind=kind)
        stats = self.stats
        stats.total_requests_processed += 1
        stats.total_prompt_tokens += len(seq.prompt)
        stats.total_completion_tokens += seq.produced
        stats.requests.pop(seq.request.request_id, None)
        log_event(
            logger,
            "request.done",
            logging.DEBUG,
            request_id=seq.request.request_id,
            reason=reason,
            prompt_tokens=len(seq.prompt),
            cached_tokens=seq.progress.cached_tokens,
            completion_tokens=seq.produced,
        )
        self._retired.append(seq)

    def _post(self) -> None:
        """Hand this step's events to their event loops: one call per loop, not one per token."""
        by_loop: dict[Any, list] = {}
        for seq in [*self.running.values(), *self._retired]:
            events = seq.take_events()
            if events:
                by_loop.setdefault(seq.loop, []).extend((seq.events, e) for e in events)
        self._retired = []
        self.stats.num_running = len(self.running)
        widths = self._kv_widths(self.kv)
        self.stats.kv_reserved_bytes, self.stats.kv_running = self.kv.reserved(widths), len(widths)
        self.stats.kv_waiting = sum(1 for s in self.waiting if s.progress.waiting_for == "kv_budget")
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is listening
                loop.call_soon_threadsafe(_deliver, items)

    def warm_up(self) -> float:
        """Run two tokens through the batch once, so the first client does not pay for compilation."""
        started = time.perf_counter()
        (uid,) = self.gen.insert([[0]], max_tokens=[2])
        self.lockstep.inserted(uid, [0], 0, None, 2)
        while True:
            self.lockstep.step(self.gen.prefill_step_size)
            _, responses = self.gen.next()
            if any(r.finish_reason is not None for r in responses):
                break
        # Finished by max_tokens (on every rank alike); its cache is not kept.
        mx.clear_cache()
        return time.perf_counter() - started


def _deliver(items: list) -> None:
    for q, event in items:
        q.put_nowait(event)


def _nbytes(cache: list | None) -> int:
    return sum(c.nbytes for c in cache or ())


def _shared_prefix_leader(seq: Sequence, prefilling: list[Sequence]) -> Sequence | None:
    """A sequence being prefilled that shares a long start with ``seq``, which should wait for it."""
    prompt = np.asarray(seq.prompt_key)
    for other in prefilling:
        if common_prefix(np.asarray(other.prompt_key), prompt) >= SHARED_PREFIX_WAIT:
            return other
    return None


def _riding(gen: BatchGenerator) -> tuple[GroupedModel, RidingPrompts] | None:
    """The generator's model and prompt batch, where prompt chunks ride on its passes."""
    model, prompts = gen.model, gen._prompt_batch
    if isinstance(model, GroupedModel) and isinstance(prompts, RidingPrompts):
        return model, prompts
    return None
