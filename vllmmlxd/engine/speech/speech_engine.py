"""The Engine of an entry whose model is a speech model: the generation routes answer 400, health,
status and metrics read idle counters, and ``transcriber`` does the work."""

from __future__ import annotations

from typing import Any

from ..task_engine import TaskEngine, task_model_info
from .transcriber import Transcriber

SPEECH_ONLY = (
    "this entry serves speech to text only (POST /v1/audio/transcriptions and /v1/audio/translations); "
    "its model cannot generate text from a prompt"
)


class SpeechOnlyEngine(TaskEngine):
    """What the worker's app needs of an engine, for a Whisper entry."""

    speech_only = True  # read by the API layer: the entry's names are the speech model's

    refusal = SPEECH_ONLY

    def __init__(self, transcriber: Transcriber, *, name: str):
        self.transcriber = transcriber
        dims = transcriber.model.dims
        info = task_model_info(
            name, context_length=int(dims.n_text_ctx), vocab_size=int(dims.n_vocab), source=str(transcriber.folder)
        )
        super().__init__(info)

    @property
    def max_queue(self) -> int:
        return self.transcriber.max_queue

    @max_queue.setter
    def max_queue(self, value: int) -> None:  # a settings push (worker/app.py) bounds the speech queue
        self.transcriber.max_queue = value

    def speech_status(self) -> dict[str, Any]:
        """What /v1/status says of the speech model: it transcribes, its queue and counters."""
        return {"transcribes": True, **self.transcriber.describe()}

    def close(self) -> None:
        self.transcriber.close()
