"""Constrained decoding with llguidance: a request's grammar, enforced token by token.

:class:`Grammars` belongs to one loaded model: it builds llguidance's view of the model's
tokenizer once (lazily, on the first constrained request), checks and compiles grammars
(bounded in size, effort and time, and cached, so a grammar checked by the API is not
compiled again on the engine thread), and makes one :class:`GrammarProcessor` per request.

A :class:`GrammarProcessor` is an mlx-lm logits processor: a batch calls each sequence's own
processors with that sequence's context and logits, so a constrained request decodes in the
same batch as free ones. It must run after every other processor of its request, so that
nothing (a logit bias) re-enables a token the grammar forbids.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import llguidance
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from ...log import log_event
from ..types import Constraint

logger = logging.getLogger("vllmmlxd.engine")

MAX_GRAMMAR_CHARS = 256 * 1024  # refused unread: compile time grows faster than size
COMPILE_SECONDS = 0.5  # a grammar that takes longer to compile is refused (it is still cached if it ends)
CACHED_GRAMMARS = 32  # compiled grammars kept: a client repeats its schema from request to request
THINK_START, THINK_END = "<think>", "</think>"
PROMPT_OPENED_WINDOW = 4  # a template that opens thinking ends its prompt with <think> and a newline


def grammar_limits() -> llguidance.LLParserLimits:
    """llguidance's effort limits (its defaults): a grammar over them is refused at compile, and
    a mask step over them ends its request, so no step stalls the batch. Errors are kept short
    (a verbose one holds the whole grammar). They do not bound the JSON schema compiler, whose
    time grows with the square of an object's properties (3,000: 0.7 s here): the timeout does."""
    return llguidance.LLParserLimits(verbose_errors=False)


class Grammars:
    """One model's grammar support: its llguidance tokenizer, compiled grammars, processors."""

    def __init__(self, tokenizer: Any, model: Any, eos_ids: Iterable[int]):
        self._hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF tokenizer
        self._vocab = _logits_width(model)
        self._eos = sorted(eos_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._think_start: int | None = None
        self._think_end: int | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._compiling: dict[str, Future] = {}  # one compile per grammar, however many ask
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar")
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's tokenizer for the model, built on first use (about a second)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._build_tokenizer()
            return self._tokenizer

    def _build_tokenizer(self) -> llguidance.LLTokenizer:
        from llguidance.hf import from_tokenizer  # imports transformers: only once it is needed

        started = time.perf_counter()
        # The logits can be wider than the tokenizer (padded embeddings): llguidance must know
        # every id the model can sample; the ids past the tokenizer's are never allowed.
        n_vocab = max(self._vocab or 0, len(self._hf))
        try:
            tok = from_tokenizer(self._hf, n_vocab=n_vocab, eos_token=self._eos)
        except Exception as exc:  # a slow (Python) tokenizer: llguidance reads fast ones only
            raise ValueError(f"constrained decoding is not available with this model's tokenizer: {exc}") from exc
        vocab = self._hf.get_vocab()
        start, end = vocab.get(THINK_START), vocab.get(THINK_END)
        self._think_start = int(start) if start is not None else None
        self._think_end = int(end) if end is not None else None
        log_event(
            logger,
            "constraint.tokenizer",
            vocab=tok.vocab_size,
            eos=self._eos,
            seconds=round(time.perf_counter() - started, 2),
        )
        return tok

    def check(self, grammar: str) -> str | None:
        """Why ``grammar`` cannot be used with this model (for a 400), or None when it compiles."""
        try:
            template = self._template(grammar)
        except ValueError as exc:
            return str(exc)
        return first_step_problem(template.deep_copy(), self.tokenizer.vocab_size)

    def processor(self, constraint: Constraint, request_id: str = "", prompt: Sequence[int] = ()) -> GrammarProcessor:
        """A fresh processor for one request. A grammar that does not compile now (the API's check
        passed it, but it left the cache and took too long to compile again) gives a processor
        that has already failed: the request ends at once with a constraint error, its client is
        told why, and nothing is raised (raises ValueError only when the model's tokenizer has no
        constrained decoding at all).

        ``after_reasoning``: when ``prompt`` opened a thinking section, the grammar holds from
        ``</think>``; otherwise the first token may be ``<think>`` (then the same) or the grammar's
        first token (a model that answers without thinking is held at once). On a model without
        those tokens the grammar holds from the start.
        """
        try:
            template = self._template(constraint.grammar)
        except ValueError as exc:
            if self._tokenizer is None:
                raise
            failed = GrammarProcessor(
                None, self._tokenizer.vocab_size, self._eos, None, request_id, report=constraint.failures.append
            )
            failed._fail(str(exc))
            return failed
        think = None
        if constraint.after_reasoning and self._think_end is not None:
            tail = list(prompt[-PROMPT_OPENED_WINDOW:])
            opened = self._think_start in tail and self._think_end not in tail
            think = (None if opened else self._think_start, self._think_end)
        return GrammarProcessor(
            template.deep_copy(),
            self.tokenizer.vocab_size,
            self._eos,
            think,
            request_id,
            report=constraint.failures.append,
        )

    def _template(self, grammar: str) -> llguidance.LLMatcher:
        """The compiled grammar in its start state (shared: callers deep-copy it).

        Compiled on a worker thread and waited for at most COMPILE_SECONDS, so neither the
        API's check nor the engine thread is held longer by any grammar.
        """
        with self._lock:
            if grammar in self._compiled:
                self._compiled.move_to_end(grammar)
                return self._compiled[grammar]
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the grammar is too large: {len(grammar)} characters, at most {MAX_GRAMMAR_CHARS}")
        tokenizer = self.tokenizer  # built before the clock starts: its second is not the grammar's
        with self._lock:
            future = self._compiling.get(grammar)
            if future is None:
                future = self._compiling[grammar] = self._pool.submit(self._compile, tokenizer, grammar)
        try:
            matcher = future.result(timeout=COMPILE_SECONDS)
        except TimeoutError:
            raise ValueError(
                f"the grammar takes too long to compile (over {COMPILE_SECONDS} s): make the schema smaller"
            ) from None
        except Exception as exc:  # llguidance raises only on misuse; still a refusal, not a crash
            raise ValueError(f"the grammar cannot be compiled: {exc!r}") from exc
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {matcher.get_error().strip()}")
        return matcher

    def _compile(self, tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
        """Compile (llguidance drops the GIL meanwhile) and cache the grammar if it is good."""
        try:
            matcher = llguidance.LLMatcher(
                tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0, limits=grammar_limits()
            )
        finally:
            with self._lock:
                self._compiling.pop(grammar, None)
        with self._lock:
            if not matcher.is_error():
                self._compiled[grammar] = matcher
                while len(self._compiled) > CACHED_GRAMMARS:
                    self._compiled.popitem(last=False)
        return matcher


class GrammarProcessor:
    """Masks a request's logits to the tokens its grammar allows next.

    mlx-lm calls a processor once per step, for the step's *next* token, with the context
    ending in the token sampled at the previous step; the first call comes before any token
    was generated (the context ends with the prompt), and one more call comes after the last
    token (EOS included). So each call but the first feeds the previous token to the matcher,
    then masks. Once the grammar is complete (or the matcher failed) only EOS is allowed.
    With ``think`` = ``(start, end)``: logits pass untouched until ``end`` (``</think>``) was
    generated; with a ``start`` as well, the first token may be that (thinking begins) or one the
    grammar allows (no thinking: the grammar holds from there).
    """

    def __init__(
        self,
        matcher: llguidance.LLMatcher | None,
        vocab_size: int,
        eos_ids: list[int],
        think: tuple[int | None, int] | None = None,
        request_id: str = "",
        report: Callable[[str], None] | None = None,
    ):
        self.matcher = matcher  # None only for a processor made failed (it reads no tokens)
        self.eos = list(eos_ids)
        self.think_start: int | None
        self.think_end: int | None
        self.think_start, self.think_end = think if think else (None, None)
        self.may_think = self.think_start is not None  # the first token may open thinking
        # The token that ends thinking, while the model thinks; None: the grammar holds.
        self.waiting_for = self.think_end if think and self.think_start is None else None
        self.request_id = request_id
        self.report = report  # told why, once, when the grammar fails (the request then ends with error)
        self.failed = False
        self.calls = 0
        self._bitmask = allocate_token_bitmask(1, vocab_size)
        self._metal = mx.metal.is_available()

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        first = self.calls == 0
        self.calls += 1
        if not first and not self._ended():
            # Waits for the previous step's token: the mask depends on it. (Starting this step's
            # forward pass first with mx.async_eval measured slower on the CPU backend.)
            self._advance(int(cast(int, tokens[-1].item())))  # a token id; mlx types item() as any scalar
        if self.waiting_for is not None:
            return logits
        return self._apply(logits)

    def acceptable(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar takes in order from here, without reading them (the
        first is the token this processor reads at its next call): speculation cuts its drafts
        there. All of them while the model thinks: the grammar does not hold there yet."""
        if self.waiting_for is not None or self.may_think or self.failed or self.matcher is None or self.calls == 0:
            return len(tokens)
        if self.matcher.is_stopped():
            return 0
        return self.matcher.validate_tokens(tokens)

    def _ended(self) -> bool:
        """Only EOS is allowed from now on (the grammar is complete, or failed): no token to read."""
        return self.waiting_for is None and (self.failed or self._live_matcher().is_stopped())

    def _live_matcher(self) -> llguidance.LLMatcher:
        assert self.matcher is not None  # a processor without one was failed when it was made
        return self.matcher

    def _advance(self, token: int) -> None:
        if self.may_think:
            self.may_think = False
            if token == self.think_start:
                self.waiting_for = self.think_end
                return
        if self.waiting_for is not None:
            if token == self.waiting_for:
                self.waiting_for = None
            return
        matcher = self._live_matcher()
        if not matcher.consume_token(token):
            self._fail(f"token {token} refused: {matcher.get_error()}")

    def _apply(self, logits: mx.array) -> mx.array:
        if not self.failed:
            matcher = self._live_matcher()
            try:
                fill_next_token_bitmask(matcher, self._bitmask)
            except Exception as exc:  # an API misuse or a bug: end this request, not the batch
                self._fail(repr(exc))
            if matcher.is_error() and not self.failed:  # e.g. a step over the effort limits
                self._fail(matcher.get_error())
        if self.failed:  # let EOS through, and nothing else
            words = self._bitmask.view(np.uint32)
            words[:] = 0
            for t in self.eos:
                words[0, t // 32] |= np.uint32(1 << (t % 32))
        elif self.may_think and self.think_start is not None:  # the first token: the grammar's, or <think>
            words = self._bitmask.view(np.uint32)
            words[0, self.think_start // 32] |= np.uint32(1 << (self.think_start % 32))
        if self._metal:
            from llguidance.mlx import apply_token_bitmask

            return apply_token_bitmask(logits, self._bitmask)
        return mx.where(mx.array(self._allowed(logits.shape[-1])), logits, -mx.inf)

    def _allowed(self, width: int) -> np.ndarray:
        """The bitmask as one bool per logit (bit i of 32-bit word w is token 32*w + i)."""
        words = self._bitmask.astype("<i4", copy=False)  # no copy on little-endian machines (all of MLX's)
        bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little").view(bool)
        if bits.shape[-1] >= width:
            return bits[:, :width]
        return np.pad(bits, ((0, 0), (0, width - bits.shape[-1])))  # ids llguidance does not know: never

    def _fail(self, error: str) -> None:
        self.failed = True
        reason = readable_error(error)
        log_event(logger, "constraint.error", logging.WARNING, request_id=self.request_id, error=reason[:500])
        if self.report is not None:
            self.report(reason[:500])


def readable_error(error: str) -> str:
    """llguidance's error without its markup (non-verbose errors end with a ``<non-verbose/>`` tag)."""
    text = error.replace("<non-verbose/>", "").strip()
    if text == "NoExtensionBias":  # llguidance's word for a state from which no token can follow
        return "nothing can follow what was written (the schema admits no finite value there)"
    return text or "the grammar failed"


def first_step_problem(matcher: llguidance.LLMatcher, vocab_size: int) -> str | None:
    """Why a compiled grammar cannot even start (a schema with no finite value, such as
    ``{"$ref": "#"}``: it compiles, and fails at its first mask), or None. ``matcher`` is a copy."""
    try:
        fill_next_token_bitmask(matcher, allocate_token_bitmask(1, vocab_size))
    except Exception as exc:  # an API misuse or a bug: still a refusal, not a crash
        return f"the grammar cannot start: {exc!r}"
    if matcher.is_error():
        return f"no output can satisfy it: {readable_error(matcher.get_error())}"
    return None


def _logits_width(model: Any) -> int | None:
    """How many logits the model gives, from its config (mlx-lm models keep it as ``args``)."""
    args = getattr(model, "args", None)
    for cfg in (args, getattr(args, "text_config", None)):
        width = cfg.get("vocab_size") if isinstance(cfg, dict) else getattr(cfg, "vocab_size", None)
        if isinstance(width, int) and width > 0:
            return width
    return None
