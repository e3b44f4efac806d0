"""The engine thread: continuous batching over mlx-lm's BatchGenerator, with a prefix cache.

Requests arrive as :class:`Sequence` objects. Each round, sequences whose client went away
leave the batch, waiting ones join it (``admission``: each first takes the longest start of its
prompt from the prefix cache), and the batch advances by one pass (``_step``): a decode step
plus a chunk of every prompt still being prefilled, sized from measured speeds so a step takes
about a second at most (``step_timer``). The pass is the same for every model: the features an
entry has take part as hooks (``step_hooks``); every change to the batch and every pass go
through ``batch.Batch``, which sends them to a sharded entry's other ranks as one plan.
Finished sequences' KV goes to the prefix cache (``store_queue``); a round's events are posted
to each asyncio loop in one call.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mlx_lm.generate import BatchGenerator, StopSequences

from ...log import log_event
from ..batch.batch import Batch, RowSetup
from ..batch.layout import read_layout
from ..batch.plans import IDLE_FRAME_S, Lockstep
from ..batch.upstream_fixes import apply_all as apply_upstream_fixes
from ..cache.cache_setup import make_prefix_cache
from ..cache.checkpoints import Captures, checkpoint_positions, segments
from ..cache.prefix_cache import PromptCache
from ..options import EngineOptions
from ..text.constraint import Grammars
from ..types import EngineStats, FinishReason, WaitingFor
from ..vision.vision_prefill import EmbeddingPrefill, Staged
from .admission import plan_admission, reserved_widths
from .batch_layout import describe, new_generator
from .kv_probe import entry_budget
from .logprobs import LogprobTap, TokenLogprob, prompt_logprobs
from .sampling import make_sampler, row_processors
from .sequence import Sequence
from .staged_prompts import StagedPrompts
from .step_hooks import DraftCounts, LayeredCaptures, RidingChunks, StepHook, StepWork
from .step_timer import StepTimer
from .store_queue import StoreNow, StoreQueue, Stores

logger = logging.getLogger("vllmmlxd.engine")


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
        # A sharded model's other ranks play each step's plan (engine/batch/batch.py, engine/distributed/lockstep.py).
        self.lockstep = lockstep or Lockstep()
        # What the model's layers keep between tokens, read once: the features below branch on it.
        # Its verify-pass probe only where speculation is asked for and may run (not on a sharded rank).
        self.layout = read_layout(model, probe=options.speculative is not None and not self.lockstep.distributed)
        # Blocks or whole sequences (cache_setup.py); the engine brings one with a disk tier.
        self.cache = (
            cache
            if cache is not None
            else make_prefix_cache(model, options, distributed=self.lockstep.distributed, layout=self.layout)
        )
        # A layered model's blocks need what a row's windowed and recurrent layers held on its way.
        self.layered = getattr(self.cache, "layered", None) if self.cache.enabled else None
        self.cache.on_drop = lambda piece: self.batch.dropped(piece)
        self.inbox: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        # A vision model's prompts with images left to prefill, before they join the batch.
        self.vision = EmbeddingPrefill(model, vision) if vision is not None else None
        self.staged: list[Staged] = []
        self.timer = StepTimer()
        self.on_admit = lambda seq: None  # the engine's admission counter
        # Run on the engine thread before each step (an embedder's batch between decode steps).
        self.before_step: list[Callable[[], None]] = []
        self._renew()
        # Admission by KV bytes (kv_budget.py); the engine sets the default limit and swaps in live changes.
        self.kv = entry_budget(
            self.model, self.options, self.layout, self.layered, drafting=self.spec is not None, draft=self.draft
        )
        # Finished sequences' KV goes into the block cache a few blocks a step (store_queue.py);
        # a sharded entry's ranks store in lockstep, at once, as does the whole-sequence cache.
        block = getattr(self.cache, "block", None)
        self.stores: Stores = (
            StoreQueue(self._insert_kv, block)
            if block and not self.lockstep.distributed
            else StoreNow(
                self._insert_kv, lambda uid, pieces: self.batch.kept(uid, pieces), distributed=self.lockstep.distributed
            )
        )
        self._retired: list[Sequence] = []  # finished this step, events not posted yet
        self._generated = 0  # tokens generated since start, for the recent rate
        self.clock = time.perf_counter  # times steps for the step timer (a test's fake model brings its own)
        self.piece: Callable[[int], str] = (
            str  # a token's text, for log-probabilities (the engine sets its tokenizer's)
        )

    @property
    def gen(self) -> BatchGenerator:
        return self.batch.gen

    def _renew(self) -> None:
        """A new batch (at start, and after a step failed), and the hooks of the features it has."""
        self.shape = new_generator(
            self.model,
            self.options,
            self.layout,
            self.lockstep,
            vision=self.vision is not None,
            draft=self.draft,
            cost=self.timer.cost,
        )
        self.spec, self.timer.riding = self.shape.spec, self.shape.riding
        self.batch = Batch(self.shape.gen, self.lockstep)
        hooks: list[StepHook] = []
        if self.vision is not None:  # first: the step's prompt work before the others read it
            hooks.append(
                StagedPrompts(self.vision, self.staged, lambda: self.gen.stream, self._staged_done, self._fail)
            )
        if self.shape.riding:
            hooks.append(RidingChunks(lambda: self.gen))
        if self.spec is not None:
            hooks.append(DraftCounts(self.spec))
        if self.layered is not None:
            hooks.append(LayeredCaptures(self.layered, lambda: self.gen, self.running, self.spec))
        self.hooks = hooks

    def features(self) -> dict:
        """The ``layout`` block of /v1/status (batch_layout.describe)."""
        block_cache = getattr(self.cache, "block", None) is not None
        distributed = self.lockstep.distributed
        return describe(self.layout, self.shape, distributed=distributed, layered=self.layered, block_cache=block_cache)

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
                self.batch.idle()
                self.stats.last_frame_at = self.lockstep.last_frame_at

    def step(self) -> bool:
        """One round: take new requests, drop the cancelled, admit, advance the batch, post events.

        Returns False once the inbox asked the engine to stop. A round does one decode step and
        one bounded prefill chunk, so a cancel is seen at the next round, within one chunk.
        """
        stopping = self._drain_inbox()
        self.cache.begin_step()  # the blocks the last step's lookups used may be evicted again
        self._drop_cancelled()
        self.stores.before_admission(waiting=bool(self.waiting))
        self._admit()
        if self.running or self.staged:
            self._step()
            self._note_kv_held()
        self.stores.between_steps(idle=not self.running and not self.staged)
        self._post()
        return not stopping

    def shutdown(self) -> None:
        """End every request still here (cancelled) and post their last events."""
        for seq in [*self.waiting, *self.running.values(), *(s.seq for s in self.staged)]:
            seq.finish("cancelled")
        self.waiting.clear()
        self.staged.clear()
        self._post()
        self.batch.stop()
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
        """Carry out this round's admission plan (``admission.plan_admission``)."""
        budget = self.kv  # read once: a live change swaps the whole budget
        plan = plan_admission(
            list(self.waiting), self._admitted(), budget, self.options.max_running, share_prefixes=self.cache.enabled
        )
        for leader in plan.leaders:
            leader.prompt_wanted = True  # cache its prompt as soon as it is prefilled
        for seq in plan.refuse:  # the budget was lowered while it waited (the API refuses it before)
            self.waiting.remove(seq)
            self.on_admit(seq)
            refusal = budget.refusal(len(seq.prompt), seq.request.sampling.max_tokens)
            self._retire(seq, "error", refusal, kind="kv_budget")
        for seq, _width in plan.join:
            self.waiting.remove(seq)
            self.on_admit(seq)
            try:
                self._insert(seq)
            except Exception as exc:  # a bad request must not take the batch down
                self._fail(seq, exc)
        self._note_queue(plan.blocked, plan.behind_prefix)

    def _admitted(self) -> list[Sequence]:
        """The sequences admitted: those in the batch and those staged."""
        return [*self.running.values(), *(s.seq for s in self.staged)]

    def _note_queue(self, blocked: WaitingFor | None, behind: set[int]) -> None:
        """Each waiting request's place in the queue and what holds it there (``blocked``: what
        stopped admission this round); read by /v1/status."""
        for position, seq in enumerate(self.waiting, 1):
            seq.progress.queue_position = position
            seq.progress.waiting_for = "shared_prefix" if id(seq) in behind else blocked

    def _insert(self, seq: Sequence) -> None:
        if seq.request.prompt_logprobs is not None:  # echo: the prompt's own, from a pass of its own first
            seq.prompt_logprobs(prompt_logprobs(self.model, seq.prompt, seq.request.prompt_logprobs, self.piece))
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
        seq.tap = LogprobTap(params.logprobs, self.piece) if params.logprobs is not None else None
        constraint, grammar = seq.request.constraint, None
        if constraint is not None:
            if self.grammars is None:
                raise ValueError("constrained decoding is not available")
            grammar = self.grammars.processor(constraint, seq.request.request_id, prompt)
        processors = row_processors(params, tap=seq.tap, grammar=grammar)
        row = RowSetup(
            self._segments(seq, cached), cache, list(prompt[:cached]), make_sampler(params), processors, stops
        )
        uid = self.batch.join(prompt[cached:], cached, tuple(source), params.max_tokens, row)
        seq.uid, seq.base = uid, cached
        self.running[uid] = seq
        for hook in self.hooks:
            hook.joined(uid, seq)

    def _segments(self, seq: Sequence, cached: int) -> list[list[int]]:
        """The prompt's uncached tokens, split where a layered model checkpoints its state."""
        if self.layered is None:
            return [seq.prompt[cached:]]
        positions: list[int] = []
        if self.layered.states:
            positions = checkpoint_positions(cached, len(seq.prompt), self.layered.block, seq.shared or None)
        seq.captures = Captures(checkpoints=frozenset(positions))
        return segments(seq.prompt, cached, positions)

    def _staged_done(self, staged: Staged) -> None:
        """A vision prompt prefilled up to its last image joins the batch."""
        self._join(staged.seq, staged.cache, staged.pos, ())

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        """One request's bad input (an image, a prompt) ends it, never the batch."""
        log_event(logger, "engine.error", logging.ERROR, request_id=seq.request.request_id, error=repr(exc))
        self._retire(seq, "error", str(exc))

    def _step(self) -> None:
        """One pass over the batch, the same for every model: the features take part as hooks."""
        for before in self.before_step:
            before()
        prompts = sum(1 for s in self.running.values() if s.progress.first_token_at is None) + len(self.staged)
        decoding = len(self.running) + len(self.staged) > prompts
        chunk = self.timer.chunk(self.options.prefill_step_size, decoding=decoding, prompts=prompts)
        work = StepWork(chunk, self.clock())
        try:
            for hook in self.hooks:
                hook.before(work)
            work.prompt_responses, work.responses = self.batch.advance(chunk)
        except Exception as exc:  # e.g. out of memory: every sequence of the batch fails, the engine lives on
            self._lost(exc)
            return
        self.batch.finished([r.uid for r in work.responses if r.finish_reason is not None])
        with self.stats.lock:
            self.stats.steps_executed += 1
            for joining, pos in work.progress:
                joining.progress.prefilled_tokens = pos
            work.prefilled += self._note_prefill(work.prompt_responses)
        work.ran = work.prefilled
        for hook in self.hooks:
            hook.after(work)
        self._cache_prompts(work.prompt_responses)
        self._timed(work, self.clock() - work.started)
        for response in work.responses:
            self._take(response)
        for hook in self.hooks:
            hook.settled(self.running)

    def _lost(self, exc: Exception) -> None:
        log_event(logger, "engine.error", logging.ERROR, running=len(self.running), error=repr(exc))
        if self.lockstep.distributed:
            raise exc  # the other ranks are mid-step: only a restart of every rank recovers
        for lost in list(self.running.values()):
            self._retire(lost, "error", str(exc))
        self.running.clear()
        self._renew()

    def _timed(self, work: StepWork, took: float) -> None:
        self.stats.last_step_s = took
        self.stats.last_frame_at = self.lockstep.last_frame_at
        if work.timed:
            self.timer.observe(took, decoded=bool(work.responses), prefilled=work.ran)
        now = time.monotonic()
        self.stats.last_step_at = now  # read by /health's liveness check
        self._generated += len(work.responses)
        self.stats.generated.note(now, self._generated)

    def _take(self, response: Any) -> None:
        """A row's token: to its sequence, which may finish (its KV to the cache) or leave the batch."""
        seq = self.running.get(response.uid)
        if seq is None:
            return
        reason = self._feed(seq, response.token, seq.tap.take(response.token) if seq.tap else None)
        if response.finish_reason is not None:
            reason = reason or ("length" if response.finish_reason == "length" else "stop")
            self.running.pop(response.uid)
            self._store(seq, response.all_tokens, response.prompt_cache)
            self._retire(seq, reason)
        elif reason is not None:
            self._leave(seq, reason, keep_kv=True)

    def _note_kv_held(self) -> None:
        """The KV bytes the batch really holds after a step (its buffers' sizes: nothing is evaluated),
        and the most it held, beside what admission reserved."""
        held = self.gen.prompt_cache_nbytes + sum(hook.kv_bytes() for hook in self.hooks)
        self.stats.kv_held_bytes = held
        self.stats.kv_peak_held_bytes = max(self.stats.kv_peak_held_bytes, held)

    def _feed(self, seq: Sequence, token: int, logprob: TokenLogprob | None = None) -> FinishReason | None:
        """One token to ``seq`` (with its log-probability when asked), timed for the TTFT and inter-token histograms."""
        previous = seq.progress.last_token_at
        reason = seq.feed(token, logprob)
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
                got = self.batch.extract([response.uid]).get(response.uid)
                if got is not None:
                    self._store(seq, got[1], got[0])

    def _leave(self, seq: Sequence, reason: FinishReason, *, keep_kv: bool) -> None:
        """Take ``seq`` out of the batch now (its KV goes to the prefix cache when asked)."""
        assert seq.uid is not None  # only a running sequence leaves the batch
        self.running.pop(seq.uid, None)
        keep = keep_kv and self.cache.enabled
        try:
            got = self.batch.leave([seq.uid], keep=keep)
        except Exception as exc:
            log_event(logger, "engine.error", logging.ERROR, request_id=seq.request.request_id, error=repr(exc))
            if self.lockstep.distributed:
                raise  # the other ranks would keep a sequence this one lost
            got = {}
        if seq.uid in got:
            cache, tokens = got[seq.uid]
            self._store(seq, tokens, cache)
        self._retire(seq, reason)

    def _store(self, seq: Sequence, tokens: list[int] | None, cache: list | None) -> None:
        if not tokens or not cache or not self.cache.enabled:
            return
        assert seq.uid is not None  # only what ran in the batch has KV to keep
        self.stores.store(seq.cache_key(tokens), cache, seq.captures, seq.uid)

    def _insert_kv(self, key: list[int], cache: list, captures: Captures | None = None) -> Any:
        if captures is not None:  # a layered model's block cache: what the sequence captured on its way
            return self.cache.insert(key, cache, owned=True, captures=captures)  # type: ignore[call-arg]
        return self.cache.insert(key, cache, owned=True)  # extracted: fresh copies

    def _retire(
        self, seq: Sequence, reason: FinishReason, error: str | None = None, *, kind: str | None = None
    ) -> None:
        for hook in self.hooks:
            hook.left(seq)
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
        widths = reserved_widths(self.kv, self._admitted())
        self.stats.kv_reserved_bytes, self.stats.kv_running = self.kv.reserved(widths), len(widths)
        self.stats.kv_waiting = sum(1 for s in self.waiting if s.progress.waiting_for == "kv_budget")
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is listening
                loop.call_soon_threadsafe(_deliver, items)

    def warm_up(self) -> float:
        """Run two tokens through the batch once, so the first client does not pay for compilation."""
        return self.batch.warm_up(self.gen.prefill_step_size)


def _deliver(items: list) -> None:
    for q, event in items:
        q.put_nowait(event)
