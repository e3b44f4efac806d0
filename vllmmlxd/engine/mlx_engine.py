"""The MLX engine: the asyncio face of one loaded model; a scheduler thread owns mlx.

``generate`` admits a request (or refuses it at once with 503 when ``max_queue`` requests
already wait) and returns its event stream. The scheduler thread batches running
requests (``continuous_batching``, up to ``max_num_seqs``; one at a time otherwise) and
posts each step's events back to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from jinja2.exceptions import SecurityError

from ..errors import InvalidRequest, KvBudgetExceeded, ModelLoadError, Overloaded
from ..log import log_event
from ..parsers.fim import detect_fim
from ..parsers.reasoning import make_reasoning_parser
from ..parsers.tools import tool_parser_class
from ..parsers.tools.harmony import HarmonyParser
from ..parsers.tools.instructions import calls_as_text, with_tool_instructions
from .batch.plans import Lockstep
from .cache.cache_setup import make_prefix_cache
from .options import EngineOptions, explicit_limit
from .speculation.mtp import required_mtp
from .step.kv_budget import KvBudget, default_limit
from .step.scheduler import Scheduler
from .step.sequence import Chain, Sequence
from .text.constraint import Grammars
from .text.detokenize import IncrementalDetokenizer
from .text.special_text import SpecialText, plain_encoder, special_tokens_of
from .text.template_vars import template_switches
from .text.tool_setup import resolve_tool_parser, template_renders_tools
from .types import Constraint, EngineEvent, EngineStats, Finished, GenerationRequest, ModelInfo, RenderedPrompt
from .vision.vision_prompt import ImagePrompter, image_parts

if TYPE_CHECKING:
    from .embeddings.embedder import MLXEmbedder
    from .loading.loader import LoadedModel

logger = logging.getLogger("vllmmlxd.engine")
EXIT_RANK_FAILED = 5  # as worker/ranks.py: the unit restarts

PROMPT_TAIL_TOKENS = 16  # the prompt's end, as text, tells a reasoning parser where generation starts
PROMPT_TAIL_CHARS = 64
_NOT_SET = object()
_SANDBOX_PROBE = [{"role": "system", "content": "probe"}, {"role": "user", "content": "probe"}]


def _usable_memory(physical: int, source: str) -> tuple[int | None, str]:
    """The machine's memory (a cgroup's limit where lower), or Metal's recommended working set where
    that is lower: past it the GPU's memory pages, and a kernel can fail."""
    info = getattr(mx, "device_info", None) or getattr(mx.metal, "device_info", None)
    try:
        working_set = int((info() if info is not None else {}).get("max_recommended_working_set_size", 0))
    except Exception:  # no device to ask (a CPU-only build)
        working_set = 0
    if working_set and (not physical or working_set < physical):
        return working_set, "Metal's working set"
    return (physical or None), source or "physical"


def thinking_of(message: dict) -> dict:
    """``message`` with its ``reasoning_content`` also as ``thinking``, where a template looks for it."""
    if "reasoning_content" in message and "thinking" not in message:
        return {**message, "thinking": message["reasoning_content"]}
    return message


def check_draft_model(draft: LoadedModel, target: LoadedModel) -> None:
    """A draft model must speak the target's tokens: the same vocabulary, id for id."""
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise ModelLoadError(
            f"the draft model {draft.name!r} does not share the tokenizer of {target.name!r} "
            f"({len(draft.tokenizer)} and {len(target.tokenizer)} tokens): speculation needs the same vocabulary"
        )


class MLXEngine:
    """Serves generation requests for one loaded model on a dedicated thread."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        name: str | None = None,
        options: EngineOptions | None = None,
        lockstep: Lockstep | None = None,
        draft: LoadedModel | None = None,
    ):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        # The entry's embedding model (``embedding_model``), set by the worker; closed with the engine.
        self.embedder: MLXEmbedder | None = None
        self.options = options or EngineOptions()
        has_template = bool(getattr(self.tokenizer, "has_chat_template", False))
        vocab = set(self.tokenizer.get_vocab())
        tool_parser, chosen = resolve_tool_parser(
            self.options.tool_call_parser, getattr(self.tokenizer, "chat_template", None), vocab
        )
        self._tool_parser = tool_parser_class(tool_parser)
        self.info = ModelInfo(
            name=name or loaded.name,
            context_length=loaded.context_length,
            vocab_size=len(self.tokenizer),
            source=str(loaded.path),
            has_chat_template=has_template,
            tool_parser=tool_parser,
            template_switches=template_switches(getattr(self.tokenizer, "chat_template", None)),
            vision=loaded.vision is not None,
            reasoning=bool(self.options.reasoning_parser) or tool_parser == "harmony",
            fim=detect_fim(vocab),
        )
        if has_template:
            self._refuse_unsafe_template()
        self._init_request_text()
        self._images: ImagePrompter | None = None
        if loaded.vision is not None and lockstep is not None and lockstep.distributed:
            # Followers play token ids; an image's features would have to reach every rank.
            raise ModelLoadError("a vision model cannot be split over ranks (distributed:) yet")
        if loaded.vision is not None:
            processor = loaded.vision.processor
            self._images = ImagePrompter(processor, self._encode, processor.image_token_id)
        # A template that ignores tools gets them (and the call format) in the system message.
        self._template_has_tools = has_template and template_renders_tools(self._render_text)
        log_event(
            logger,
            "engine.tools",
            parser=tool_parser,
            chosen=chosen,
            tools_in=("template" if self._template_has_tools else "system prompt, added by vllmmlxd"),
        )
        self.stats = EngineStats()
        self.max_queue = self.options.max_queue
        self._eos = set(self.tokenizer.eos_token_ids)
        self._special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        # Special tokens' texts, for the parsers that need to see some (<think> as an added token).
        self._special_text = {t: self.tokenizer.convert_ids_to_tokens(t) for t in self._special}
        self._waiting = 0
        self._lock = threading.Lock()
        if draft is not None:
            check_draft_model(draft, loaded)
        distributed = lockstep is not None and lockstep.distributed
        drafter: Any = draft.model if draft is not None else None  # a draft model, or the MTP layers
        if self.options.speculative is not None and self.options.speculative.method == "mtp" and not distributed:
            drafter = required_mtp(Path(loaded.path), self.model, loaded.name)
        self._scheduler = Scheduler(
            self.model,
            self._eos,
            self.options,
            self.stats,
            lockstep,
            vision=loaded.vision.model if loaded.vision else None,
            draft=drafter,
            # The disk tier (if any) is keyed by the weights the model was loaded from.
            cache=make_prefix_cache(self.model, self.options, distributed=distributed, weights=loaded.path),
        )
        self._scheduler.on_admit = self._admitted
        self._scheduler.piece = lambda token: self._decode([token])
        features = self._scheduler.features()
        log_event(
            logger,
            "engine.layout",
            family=features["family"],
            layers=",".join(f"{kind}:{n}" for kind, n in features["layers"].items()),
            batching=features["batching"],
            prefix_cache=features["prefix_cache"],
            speculation_off=(features["speculation"] or {}).get("off"),
        )
        self._held_at_start = mx.get_active_memory()  # the weights (and draft, embedder): what a default budget leaves
        self._kv_mb: object = _NOT_SET  # the max_kv_memory_mb the budget was made from
        self.set_kv_budget(None if self.options.kv_budget_bytes is None else self.options.kv_budget_bytes / 2**20)
        self._grammars = self._scheduler.grammars = Grammars(
            self.tokenizer, self.model, self._eos
        )  # built on first use
        if not self._scheduler.lockstep.distributed:  # a rank warms up on its engine thread (Scheduler.run)
            log_event(logger, "engine.warm", seconds=round(self._scheduler.warm_up(), 2))
        self.ranks: list[dict] = []  # a distributed entry's ranks, as they said at the handshake
        self.distribution: dict = {}  # and its backend, split and each rank's share (set by the worker)
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._scheduler.run()
        except BaseException as exc:
            if not self._scheduler.lockstep.distributed:
                raise
            # The other ranks are mid-step or waiting for a frame: only a restart of the unit recovers.
            log_event(logger, "rank.failed", logging.ERROR, rank=0, error=f"{type(exc).__name__}: {exc}")
            logging.shutdown()
            os._exit(EXIT_RANK_FAILED)

    # -- the asyncio side ---------------------------------------------------

    def detokenize(self, tokens: list[int]) -> str:
        return self._decode(tokens)

    def tokenizer_info(self) -> dict[str, Any]:
        hf = getattr(self.tokenizer, "_tokenizer", self.tokenizer)  # mlx-lm's wrapper holds the HF tokenizer
        return {
            "tokenizer_class": type(hf).__name__,
            "eos_token": getattr(hf, "eos_token", None),
            "bos_token": getattr(hf, "bos_token", None),
            "pad_token": getattr(hf, "pad_token", None),
            "chat_template": getattr(self.tokenizer, "chat_template", None),
        }

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> list[int]:
        # mlx-lm would default enable_thinking to "the vocabulary has a <think> token"; a template
        # that reads the flag should see thinking allowed unless the request turns it off.
        kwargs = {"enable_thinking": True, **(template_kwargs or {})}
        if self._tool_parser is HarmonyParser:  # GPT-OSS's template reads a turn's reasoning as ``thinking``
            messages = [thinking_of(m) for m in messages]
        if tools and not self._template_has_tools:
            messages = with_tool_instructions(calls_as_text(messages, self._tool_parser), tools, self._tool_parser)
        elif tools:
            kwargs["tools"] = tools
        # Special-token text in the request stays text (see engine.special_text); without any, as before.
        marked, changed = self._request_text.mark(messages)
        marked_kwargs, kwargs_changed = self._request_text.mark(kwargs)
        if not (changed or kwargs_changed):
            return list(
                self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
            )
        rendered = self.tokenizer.apply_chat_template(
            marked, add_generation_prompt=True, tokenize=False, **marked_kwargs
        )
        return self._request_text.encode(rendered, self._encode, self._encode_plain, self._special_token_ids)

    def render(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> RenderedPrompt:
        """The conversation's tokens, each image part expanded into the model's image tokens."""
        plain, images = image_parts(messages)
        tokens = self.apply_chat_template(plain, tools=tools, template_kwargs=template_kwargs)
        if not images:
            return RenderedPrompt(tokens)
        if self._images is None:  # the API refuses images for a text model first; this is the backstop
            raise ValueError(f"{self.info.name} takes no images")
        return self._images.expand(tokens, images)

    def _refuse_unsafe_template(self) -> None:
        """A chat template that reaches past the jinja sandbox (Python internals: the shape of
        CVE-2024-34359) on a plain conversation fails the load with a clear reason; one that does
        so only on some conversations is refused per request (400, in api.prompt)."""
        for tools in (None, [{"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}]):
            try:
                self._render_text(_SANDBOX_PROBE, tools)
            except SecurityError as exc:
                raise ModelLoadError(
                    f"the model's chat template tries an operation the template sandbox forbids "
                    f"({exc}); refusing to serve it"
                ) from None
            except Exception:  # a template may refuse this conversation: that is for requests to find out
                pass

    def _init_request_text(self) -> None:
        hf = getattr(self.tokenizer, "_tokenizer", self.tokenizer)  # mlx-lm's wrapper holds the HF tokenizer
        special, added = special_tokens_of(hf)
        self._request_text = SpecialText(special, added)
        self._encode_plain = plain_encoder(hf, self._encode, special)
        self._special_token_ids = {i for i in self.tokenizer.convert_tokens_to_ids(special) if isinstance(i, int)}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render_text(self, messages: list[dict], tools: list[dict] | None) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        """Queue ``request`` (or raise :class:`Overloaded` at once) and return its event stream.

        Closing the stream early, or cancelling the task reading it, cancels the request.
        """
        if request.prompt_logprobs is not None and self._scheduler.lockstep.distributed:
            # Its own pass over the prompt would need every rank: a sharded entry's ranks step only the batch.
            raise InvalidRequest(
                "the prompt's log-probabilities (echo) are not served by a sharded entry", param="echo"
            )
        budget = self._scheduler.kv
        prompt, max_tokens = len(request.prompt_tokens), request.sampling.max_tokens
        if budget.verdict([], budget.width(prompt, max_tokens)) == "never":
            alone = budget.verdict([], budget.width(prompt, 1)) == "never"  # the prompt's fault, not max_tokens'
            raise KvBudgetExceeded(budget.refusal(prompt, max_tokens), param="messages" if alone else "max_tokens")
        with self._lock:
            if self._waiting >= self.max_queue:
                raise Overloaded(
                    f"the engine is busy: {self.stats.num_running} requests running and {self._waiting} waiting "
                    f"(max_queue {self.max_queue}); retry later",
                    retry_after=self._retry_after(),
                )
            detok = IncrementalDetokenizer(self._decode, request.prompt_tokens)
            seq = Sequence(
                request,
                asyncio.get_running_loop(),
                detok,
                self._eos,
                self._special,
                parser=self._parser_for(request),
                token_text=self._special_text.get,
            )
            self._waiting += 1
            self.stats.num_waiting = self._waiting
            self.stats.requests[request.request_id] = seq.progress
        self._scheduler.inbox.put(seq)
        return self._events(seq)

    def set_kv_budget(self, mb: float | None) -> None:
        """The KV budget of running requests: ``max_kv_memory_mb``, or (None) the default, what
        the machine has left after what MLX holds now (the weights), the prefix cache and a margin.
        At load, and when a live settings push changes it: queued requests meet the new budget
        (one that can never fit it now ends with a 400's error)."""
        if self._kv_mb is not _NOT_SET and mb == self._kv_mb:
            return
        self._kv_mb = mb
        limit: int | None
        if mb is not None:
            limit, source = explicit_limit(mb)
        else:
            usable, where = _usable_memory(self.options.memory_bytes, self.options.memory_source)
            limit, source = default_limit(usable, where, self._held_at_start, self.options.cache_budget_bytes)
        budget: KvBudget = self._scheduler.kv.with_limit(limit, source)
        self._scheduler.kv = budget  # one reference swap: the engine thread reads the whole budget at once
        log_event(
            logger,
            "engine.kv_budget",
            budget_mb=round(limit / 2**20, 1) if limit is not None and budget.active else None,
            bytes_per_token=budget.layout.per_token if budget.layout is not None else None,
            largest_request_tokens=budget.largest_request(),
            source=source,
        )

    def kv_room(self) -> int | None:
        """The most tokens (prompt + max_tokens) one request may have under the KV budget; None: no limit."""
        return self._scheduler.kv.largest_request()

    def kv_status(self) -> dict:
        """The ``kv_budget`` block of /v1/status: the budget, what running requests reserve, what the
        batch holds, how many wait for room."""
        stats = self.stats
        return self._scheduler.kv.describe(stats.kv_reserved_bytes, stats.kv_held_bytes, stats.kv_peak_held_bytes) | {
            "running": stats.kv_running,
            "waiting": stats.kv_waiting,
        }

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _parser_for(self, request: GenerationRequest) -> Chain | HarmonyParser | None:
        """The request's output parser: reasoning (told how the prompt ends: a template may open
        <think>), then tool calls out of the answer when tools were offered and calls are read.
        A model that speaks harmony (GPT-OSS) has one parser for all three: its channels."""
        use = request.tool_use
        if self._tool_parser is HarmonyParser:
            if not request.reasoning and use is None:
                return None  # a raw completion: the text as generated
            tail = self._decode(request.prompt_tokens[-PROMPT_TAIL_TOKENS:])[-PROMPT_TAIL_CHARS:]
            offered = list(use.tools) if use is not None else None
            return HarmonyParser(offered, calls=use is not None and use.parse_calls, prompt_tail=tail)
        reasoning = None
        if request.reasoning and self.options.reasoning_parser:
            tail = self._decode(request.prompt_tokens[-PROMPT_TAIL_TOKENS:])[-PROMPT_TAIL_CHARS:]
            reasoning = make_reasoning_parser(self.options.reasoning_parser, tail)
        tools = self._tool_parser(list(use.tools)) if use is not None and use.parse_calls else None
        return Chain(reasoning, tools) if reasoning or tools else None

    def _admitted(self, seq: Sequence) -> None:
        """Called by the scheduler thread when a sequence leaves the queue (to run, or cancelled)."""
        with self._lock:
            self._waiting -= 1
            self.stats.num_waiting = self._waiting

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: the soonest running request to end at its current pace."""
        now = time.monotonic()
        remaining = [
            (p.max_tokens - p.generated_tokens) * (now - p.first_token_at) / p.generated_tokens
            for p in list(self.stats.requests.values())
            if p.first_token_at is not None and p.generated_tokens > 0
        ]
        return int(min(max(math.ceil(min(remaining, default=1.0)), 1), 60))

    async def _events(self, seq: Sequence) -> AsyncGenerator[EngineEvent, None]:
        try:
            while True:
                event = await seq.events.get()
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            seq.request.cancelled.set()

    def memory(self) -> dict[str, float]:
        gb = 1024**3
        return {
            "active_memory_gb": round(mx.get_active_memory() / gb, 3),
            "peak_memory_gb": round(mx.get_peak_memory() / gb, 3),
            "cache_memory_gb": round(mx.get_cache_memory() / gb, 3),
        }

    def check_constraint(self, constraint: Constraint) -> str | None:
        """Why ``constraint``'s grammar cannot be used (the API answers 400), or None when it compiles.

        Compiles it once (cached, so the engine thread does not compile it again); this can
        take up to a few hundred milliseconds for a very large grammar.
        """
        return self._grammars.check(constraint.grammar)

    def before_each_step(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on the engine thread before each of its steps (an embedder's batches go
        between decode steps: embedder.EngineTurns)."""
        self._scheduler.before_step.append(hook)

    def distributed_status(self) -> dict | None:
        """A distributed entry's backend, split and ranks (host, pid, share, last step and wait
        times), for /v1/status, /metrics and the daemon; None for a single process."""
        lockstep = self._scheduler.lockstep
        if not lockstep.distributed:
            return None
        live = lockstep.describe() or {}
        reports = {r.get("rank"): r for r in live.get("followers", [])}
        shares = self.distribution.get("shares") or []
        ranks = []
        for rank, said in enumerate(self.ranks):
            row = {
                "rank": rank,
                "host": said.get("host"),
                "pid": said.get("pid"),
                "share": shares[rank] if rank < len(shares) else None,
            }
            if rank == 0:
                row["step_ms"] = round(self.stats.last_step_s * 1000, 3)
            else:
                report = reports.get(rank) or {}
                row |= {"step_ms": report.get("step_ms"), "wait_ms": report.get("wait_ms")}
            ranks.append(row)
        return {
            "backend": self.distribution.get("backend"),
            "parallel": self.distribution.get("parallel"),
            "world": len(self.ranks),
            "frames": live.get("frames", 0),
            "overflow_frames": live.get("overflow_frames", 0),
            "ranks": ranks,
        }

    def speculation_status(self) -> dict | None:
        """The entry's speculative decoding (method, draft width, tokens drafted and accepted since
        start); None when it does not speculate."""
        spec, options = self._scheduler.spec, self.options.speculative
        if options is None:
            return None
        if spec is None:  # asked for, and the model's layout (or a sharded entry) cannot: say why
            why = self._scheduler.features()["speculation"]
            return {"method": options.method, "num_draft": options.num_draft, **(why or {})}
        stats = spec.stats
        return {
            "method": options.method,
            "num_draft": options.num_draft,
            "verify_steps": stats.steps,
            "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted,
            "acceptance_rate": round(stats.acceptance, 3),
        }

    def cache_status(self) -> dict:
        """The prefix cache's ``cache`` block of /v1/status."""
        return self._scheduler.cache.describe()

    def layout_status(self) -> dict:
        """The ``layout`` block of /v1/status: what the model's layers keep, and what the engine
        does with them (its batch, its prefix cache, speculation: off, and why, where it cannot)."""
        return self._scheduler.features()

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close()
        self._scheduler.inbox.put(None)
        self._thread.join(timeout=10)
