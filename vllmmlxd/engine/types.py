"""What crosses the engine boundary: requests in, typed events out. No mlx here.

The API layers import this module (and ``embeddings/embedding_types.py`` for embeddings). Each
API family's response is a translation of the same event stream; a non-streaming one is its fold.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "cancelled", "error", "tool_calls"]  # timeouts cancel, in the API layer
# Why a queued request is not running yet: every row is taken, its KV does not fit the budget
# beside the running requests (or one before it waits for that), or it waits for a prompt being
# prefilled that shares its start.
WaitingFor = Literal["max_num_seqs", "kv_budget", "shared_prefix"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, already merged with the model's defaults and validated."""

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    speculative: bool = True  # an extension: False opts this request out of the entry's speculation
    logprobs: int | None = None  # each written token's log-probability, with this many top candidates (0..20)


@dataclass(frozen=True)
class Constraint:
    """Decoding held to a grammar (llguidance's Lark dialect): structured output, a forced tool call.

    ``after_reasoning``: the model reasons freely first; the grammar holds from the end of its
    reasoning section (the token of ``</think>``) on.
    """

    grammar: str
    after_reasoning: bool = False
    # Written by the engine when the grammar could not be held while decoding (why, first):
    # the request then ends with ``error`` of kind ``constraint``, never as a normal answer.
    failures: list[str] = field(default_factory=list, compare=False, repr=False)


@dataclass(frozen=True)
class ToolUse:
    """How a request's answer may hold tool calls: the tools offered (OpenAI's shape), and
    whether calls are read out of the text (False: ``tool_choice: none``, the text stays text)."""

    tools: tuple[dict, ...] = ()
    parse_calls: bool = True


@dataclass(frozen=True)
class DecodedImage:
    """An image of a request, decoded upright to RGB by the API layer (``api.images.decode``)."""

    pixels: object  # a PIL.Image.Image in RGB mode (typed loosely: only the engine's processor reads it)
    width: int
    height: int
    key: str  # sha256 hex of the pixels and their size: what the prefix cache knows the image by


@dataclass(frozen=True)
class ImageSpan:
    """One image's place in a prompt: the tokens ``start .. start + length`` are its placeholders
    (the model's image layout, expanded), which the vision tower's features replace at prefill.
    ``inputs`` are the processor's arrays for it (numpy: made off the engine thread)."""

    start: int
    length: int
    key: str
    inputs: dict = field(compare=False, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class RenderedPrompt:
    """A conversation rendered for the model: its token ids and, for a vision model, where its
    images sit among them."""

    tokens: list[int]
    images: tuple[ImageSpan, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)


_ids = itertools.count(1)


@dataclass
class GenerationRequest:
    """One generation: prompt token ids and sampling. ``cancelled`` is set from any thread."""

    prompt_tokens: list[int]
    sampling: SamplingParams
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    stream_interval: int = 1
    reasoning: bool = False  # run the model's reasoning parser (chat requests; a raw completion is all answer)
    tool_use: ToolUse | None = None  # tools were offered: run the model's tool-call parser
    constraint: Constraint | None = None  # held to a grammar while decoding
    images: tuple[ImageSpan, ...] = ()  # a vision model's images, placed among ``prompt_tokens``
    owner: str | None = None  # the key it came with (None on an open entry): who may see its progress
    # The prefix cache shares KV only between requests of one salt (the key's, by the entry's
    # cache_scope, and the request's own cache_salt); None: with every unsalted request.
    cache_salt: str | None = None
    # The prompt's own log-probabilities (completions' ``echo``), with this many top candidates each.
    prompt_logprobs: int | None = None
    # A predicted output (OpenAI's ``prediction``): its tokens are this request's drafts when the entry speculates.
    prediction: tuple[int, ...] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    created: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt's, served from the prefix cache
    # A request that sent a predicted output: its prediction's tokens drafted, and of those, kept.
    predicted_tokens: int = 0
    accepted_predicted: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    """New answer text (stop strings already held back and cut)."""

    text: str
    token_count: int = 1


@dataclass(frozen=True)
class ReasoningDelta:
    """New reasoning text: what a reasoning model thinks before it answers (``<think>...</think>``)."""

    text: str
    token_count: int = 1


@dataclass(frozen=True)
class ToolCallDelta:
    """One complete tool call in the answer: its position among the response's calls, the
    function's name and its arguments (a JSON object's text)."""

    index: int
    name: str
    arguments: str
    token_count: int = 1


@dataclass(frozen=True)
class Finished:
    """The last event of every generation; ``stop_sequence`` is the stop string that ended it, if one did."""

    reason: FinishReason
    usage: Usage
    error: str | None = None
    stop_sequence: str | None = None
    # With ``error``: "constraint" when the request's grammar could not be held (its schema's
    # fault, a 4xx), "kv_budget" when its KV can never fit the budget (lowered while it waited:
    # a 400), None for the engine's own failures.
    error_kind: str | None = None


@dataclass(frozen=True)
class Logprobs:
    """The log-probabilities of the tokens written since the last ones sent (``logprobs.TokenLogprob``
    entries, in order); sent before the text those tokens made."""

    entries: tuple[Any, ...]
    prompt: bool = False  # the prompt's tokens (the first has none: None), before any written token


EngineEvent = TextDelta | ReasoningDelta | ToolCallDelta | Logprobs | Finished


@dataclass(frozen=True)
class ModelInfo:
    """What the API layers may know of the loaded model."""

    name: str
    context_length: int
    vocab_size: int
    source: str
    has_chat_template: bool = True
    tool_parser: str | None = None  # the tool-call family, resolved at load (never "auto")
    # The chat template's switches a request may set (chat_template_kwargs), read at load.
    template_switches: frozenset[str] = frozenset({"enable_thinking"})
    vision: bool = False  # a vision-language model (loaded through mlx-vlm)
    reasoning: bool = False  # its reasoning comes apart from its answer (a reasoning parser, or harmony's channels)
    fim: str | None = None  # its fill-in-the-middle prompt form (text.fim), read from its tokenizer; None: none


@dataclass
class RequestProgress:
    """Where one admitted request stands; written by the engine thread, read by /v1/status."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    generated_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache
    prefilled_tokens: int = 0  # prompt tokens in the KV cache so far (cached ones included)
    cache_hit_type: str = "none"  # exact, prefix, lcp (longest common prefix) or none
    drafted_tokens: int = 0  # speculation: tokens drafted for it, and how many its model accepted
    accepted_tokens: int = 0
    queue_position: int | None = None  # 1 for the next to run, while it waits in the engine's queue
    waiting_for: WaitingFor | None = None
    waited_for: WaitingFor | None = None  # what held it in the queue last, kept once it started
    owner: str | None = None  # the key it came with: /v1/status shows a key its own requests only

    @property
    def phase(self) -> Literal["queued", "prefill", "generation"]:
        if self.started_at is None:
            return "queued"
        return "prefill" if self.first_token_at is None else "generation"

    def snapshot(self, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        ttft = self.first_token_at - self.started_at if self.first_token_at and self.started_at else None
        decoding = now - self.first_token_at if self.first_token_at else 0.0
        return {
            "request_id": self.request_id,
            "phase": self.phase,
            "queued_s": round((self.started_at or now) - self.queued_at, 3),
            "ttft_s": round(ttft, 3) if ttft is not None else None,
            "tokens_per_second": round((self.generated_tokens - 1) / decoding, 1) if decoding > 0 else None,
            "prompt_tokens": self.prompt_tokens,
            "cache_hit_type": self.cache_hit_type,
            "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "generated_tokens": self.generated_tokens,
            "max_tokens": self.max_tokens,
            "progress": self.fraction_done(),
            "queue_position": self.queue_position,
            "waiting_for": self.waiting_for,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
        }

    def fraction_done(self) -> float | None:
        """How far the current phase is: the prompt's tokens prefilled (cached ones included)
        while it is prefilled, then the tokens generated of ``max_tokens``."""
        if self.first_token_at is None:
            return round(self.prefilled_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0
        return round(self.generated_tokens / self.max_tokens, 4) if self.max_tokens else None


# Seconds; time to first token spans a queue and a prefill, a gap between tokens one step.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@dataclass
class LatencyHistogram:
    """Cumulative bucket counts and a sum, as Prometheus histograms keep them; no prometheus here."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += seconds
        self.count += 1


@dataclass
class RecentRate:
    """Tokens per second over the last ``window`` seconds, from (time, running total) samples."""

    window: float = 10.0
    samples: list[tuple[float, int]] = field(default_factory=list)

    def note(self, now: float, total: int) -> None:
        self.samples.append((now, total))
        while len(self.samples) > 2 and self.samples[1][0] < now - self.window:
            self.samples.pop(0)

    def rate(self, now: float) -> float:
        recent = [s for s in list(self.samples) if s[0] >= now - self.window]
        if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
            return 0.0
        (t0, n0), (t1, n1) = recent[0], recent[-1]
        return (n1 - n0) / max(now - t0, t1 - t0)


@dataclass
class EngineStats:
    """Counters for /v1/status and /metrics; written by the engine thread, read anywhere."""

    # Held while a step's count and its prompts' progress change, and while /v1/status reads them,
    # so a reader never sees one step's progress beside the previous step's count.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    started: float = field(default_factory=time.time)
    steps_executed: int = 0
    num_running: int = 0
    num_waiting: int = 0
    total_requests_processed: int = 0
    total_prompt_tokens: int = 0
    total_completion_tokens: int = 0
    requests: dict[str, RequestProgress] = field(default_factory=dict)
    ttft: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(TTFT_BUCKETS))
    inter_token: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(ITL_BUCKETS))
    generated: RecentRate = field(default_factory=RecentRate)  # all tokens generated, for a recent rate
    # time.monotonic() when the engine thread last completed a step or woke up to new work:
    # /health says "degraded" when work waits and this grows old (worker/liveness.py).
    last_step_at: float = field(default_factory=time.monotonic)
    last_step_s: float = 0.0  # how long the last step took
    # A distributed entry's rank 0: when it last exchanged a frame with the other ranks (it does
    # at least every 2 s, idle or not); /health says "degraded" when that grows old.
    last_frame_at: float | None = None
    # The KV budget of running requests (engine/step/kv_budget.py): what the admitted reserve, how many
    # they are, how many wait for room, and what the batch's buffers really hold (and held at most).
    kv_reserved_bytes: int = 0
    kv_running: int = 0
    kv_waiting: int = 0
    kv_held_bytes: int = 0
    kv_peak_held_bytes: int = 0

    def active_requests(self, owner: str | None = None) -> list[dict]:
        """Snapshots of the requests ``owner`` (a key's name; None on an open entry) has queued or
        running, oldest first: another key's are none of its business."""
        return [r.snapshot() for r in list(self.requests.values()) if r.owner == owner]

    def tokens_per_second(self, now: float | None = None) -> float:
        """Generated tokens per second over the last few seconds, all requests together."""
        return round(self.generated.rate(time.monotonic() if now is None else now), 1)


class Engine(Protocol):
    """The face the API layers see. The MLX implementation lives in ``mlx_engine``."""

    info: ModelInfo
    stats: EngineStats

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str:
        """``tokens`` as text, special tokens written out (a completion's echoed token-id prompt)."""
        ...

    def tokenizer_info(self) -> dict[str, Any]:
        """The tokenizer's class, special tokens and chat template (``GET /tokenizer_info``)."""
        ...

    def apply_chat_template(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> list[int]: ...

    def render(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> RenderedPrompt:
        """``apply_chat_template``, where messages may hold image parts ``{"type": "image", "image":
        DecodedImage}`` (a vision model only): each becomes the model's image tokens. Slow for images
        (the processor resizes and tiles them): call it off the event loop."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        """Admit the request (raising ``Overloaded`` when the queue is full) and return
        its event stream; closing the stream early cancels the request."""
        ...

    def check_constraint(self, constraint: Constraint) -> str | None:
        """Why ``constraint``'s grammar cannot be used with this model (not llguidance's Lark, an
        invalid or too large schema: the API answers 400 with it), or None when it is fine.
        Call it before ``generate``: a request whose grammar fails later ends with ``error``."""
        ...

    def memory(self) -> dict[str, float]: ...

    def cache_status(self) -> dict:
        """The prefix cache: type, entries, hit_rate, memory_mb, budget_mb and counters."""
        ...

    def close(self) -> None: ...
