"""The Engine of an entry whose model is a speech model: the generation routes answer 400, health,
status and metrics read idle counters, and ``transcriber`` does the work."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import mlx.core as mx

from ...errors import InvalidRequest
from ..types import Constraint, EngineEvent, EngineStats, GenerationRequest, ModelInfo, RenderedPrompt
from .transcriber import Transcriber

SPEECH_ONLY = (
    "this entry serves speech to text only (POST /v1/audio/transcriptions and /v1/audio/translations); "
    "its model cannot generate text from a prompt"
)


class SpeechOnlyEngine:
    """What the worker's app needs of an engine, for a Whisper entry."""

    speech_only = True  # read by the API layer: the entry's names are the speech model's

    def __init__(self, transcriber: Transcriber, *, name: str):
        self.transcriber = transcriber
        # has_chat_template True: chat requests reach apply_chat_template, which says why they cannot run.
        self.info = ModelInfo(
            name=name,
            context_length=int(transcriber.model.dims.n_text_ctx),
            vocab_size=int(transcriber.model.dims.n_vocab),
            source=str(transcriber.folder),
            has_chat_template=True,
            tool_parser=None,
        )
        self.stats = EngineStats()

    @property
    def max_queue(self) -> int:
        return self.transcriber.max_queue

    @max_queue.setter
    def max_queue(self, value: int) -> None:  # a settings push (worker/app.py) bounds the speech queue
        self.transcriber.max_queue = value

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        raise InvalidRequest(SPEECH_ONLY, param="model")

    def detokenize(self, tokens: list[int]) -> str:
        raise InvalidRequest(SPEECH_ONLY, param="model")

    def tokenizer_info(self) -> dict[str, Any]:
        raise InvalidRequest(SPEECH_ONLY, param="model")

    def apply_chat_template(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> list[int]:
        raise InvalidRequest(SPEECH_ONLY, param="model")

    def render(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> RenderedPrompt:
        raise InvalidRequest(SPEECH_ONLY, param="model")

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        raise InvalidRequest(SPEECH_ONLY, param="model")

    def check_constraint(self, constraint: Constraint) -> str | None:
        return SPEECH_ONLY

    def memory(self) -> dict[str, float]:
        gb = 1024**3
        return {
            "active_memory_gb": round(mx.get_active_memory() / gb, 3),
            "peak_memory_gb": round(mx.get_peak_memory() / gb, 3),
            "cache_memory_gb": round(mx.get_cache_memory() / gb, 3),
        }

    def cache_status(self) -> dict:
        return {
            "type": "none",
            "entries": 0,
            "hit_rate": 0.0,
            "memory_mb": 0.0,
            "budget_mb": 0.0,
            "hits": 0,
            "misses": 0,
            "cached_tokens": 0,
            "evictions": 0,
        }

    def speech_status(self) -> dict[str, Any]:
        """What /v1/status says of the speech model: it transcribes, its queue and counters."""
        return {"transcribes": True, **self.transcriber.describe()}

    def close(self) -> None:
        self.transcriber.close()
