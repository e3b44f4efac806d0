"""The speech model of a worker: mlx-audio's Whisper, fed one upload at a time by a thread of its own.

Requests queue for the ``mlx-speech`` thread (at most ``max_queue`` waiting: past that, 503 at
once); each runs mlx-audio's own ``generate`` over the decoded samples, which cuts long audio
into Whisper's 30 s windows itself. A failure fails its request, never the thread or the worker.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError, Overloaded
from ...extras import install_hint, missing_message
from ...log import log_event
from ...store.layout import hub_snapshot, store_copy
from ..task_engine import Job, JobThread
from .decode import SAMPLE_RATE
from .formats import Transcript

logger = logging.getLogger("vllmmlxd.engine")


def is_whisper_config(config: dict) -> bool:
    """A Whisper checkpoint's config.json: mlx-community's (model_type whisper) or the older MLX one (dims only)."""
    return config.get("model_type") == "whisper" or {"n_mels", "n_audio_ctx", "n_text_ctx"} <= set(config)


def speech_folder(spec: str, state_dir: Path | None = None) -> Path | None:
    """The local folder a non-builtin spec names: the folder itself, or a repo id's copy in the
    store (``vllmmlxctl pull``) or in the hub cache; None when there is none here."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if state_dir is None or path.exists() or spec.count("/") != 1 or spec.startswith(("/", ".", "~")):
        return None
    return store_copy(spec, state_dir) or hub_snapshot(spec)


def is_speech_spec(spec: str | None, state_dir: Path | None = None) -> bool:
    """True when a ``model:`` spec names a speech-to-text model: a speech builtin, or a Whisper
    folder (given as a path, or as a repo id pulled into the store or the hub cache)."""
    if not spec:
        return False
    if spec.startswith("builtin:"):
        from ..loading import builtin  # here, not above: the API imports this module, and builtin brings mlx

        entry = builtin.BUILTINS.get(spec[len("builtin:") :])
        return entry is not None and entry.kind == "speech"
    folder = speech_folder(spec, state_dir)
    if folder is None:
        return False
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and is_whisper_config(config)


@dataclass(frozen=True)
class SpeechRequest:
    """One transcription or translation, decoded: 16 kHz mono samples and the request's options."""

    samples: np.ndarray
    task: str = "transcribe"  # or "translate" (to English)
    language: str | None = None  # a Whisper code; None: detected from the first window
    temperature: float | None = None  # None: mlx-audio's fallback ladder (0.0 up to 1.0)
    prompt: str | None = None
    word_timestamps: bool = False

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def generate_options(request: SpeechRequest) -> dict[str, Any]:
    """mlx-audio's ``generate`` keywords for ``request``: a given temperature is the only one tried
    (0: greedy); none given leaves mlx-audio's ladder of fallbacks."""
    options: dict[str, Any] = {
        "language": request.language,
        "task": request.task,
        "initial_prompt": request.prompt or None,
        "word_timestamps": request.word_timestamps,
        "verbose": None,  # no progress bar, no printing
    }
    if request.temperature is not None:
        options["temperature"] = float(request.temperature)
    return options


def to_transcript(output: Any, request: SpeechRequest) -> Transcript:
    """mlx-audio's STTOutput as a Transcript (its text stripped at the ends, as OpenAI's is)."""
    return Transcript(
        text=(output.text or "").strip(),
        language=output.language or request.language or "en",
        duration=request.duration,
        task=request.task,
        segments=list(output.segments or []),
    )


@dataclass
class SpeechStats:
    """The speech thread's counters (read by /v1/status; written by that thread, ``waiting`` by both)."""

    requests: int = 0
    errors: int = 0
    waiting: int = 0
    running: int = 0
    audio_s: float = 0.0
    busy_s: float = 0.0

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "waiting": self.waiting,
            "running": self.running,
            "audio_seconds": round(self.audio_s, 1),
            "busy_seconds": round(self.busy_s, 1),
            "realtime_factor": round(self.audio_s / self.busy_s, 2) if self.busy_s else None,
        }


class Transcriber:
    """A Whisper model served on the ``mlx-speech`` thread, one request at a time."""

    def __init__(self, folder: Path, *, name: str, source: str, max_queue: int = 64, threaded: bool = True):
        from mlx_audio.stt import load  # type: ignore[import-untyped]

        self.folder, self.source = folder, source
        self.name = name
        self.max_queue = max_queue
        self.stats = SpeechStats()
        with warnings.catch_warnings():  # mlx-audio warns (never raises) when the processor is missing
            warnings.simplefilter("error", UserWarning)
            self.model = load(folder)  # evaluated here: the speech thread then only reads it
        self.translates = bool(self.model.is_multilingual)  # English-only checkpoints cannot translate
        self._jobs = JobThread("mlx-speech", self._handle) if threaded else None

    async def transcribe(self, request: SpeechRequest) -> Transcript:
        """The request's transcript, once the thread gets to it; 503 when ``max_queue`` wait already."""
        if self.stats.waiting >= self.max_queue:
            raise Overloaded(
                f"{self.stats.waiting} transcriptions are waiting for this model (max_queue {self.max_queue}); retry later"
            )
        assert self._jobs is not None, "a transcriber made with threaded=False runs on its caller's thread"
        self.stats.waiting += 1
        return await self._jobs.submit(request)

    def run(self, request: SpeechRequest) -> Transcript:
        """Transcribe on the calling thread (the speech thread, a bench, a test)."""
        with warnings.catch_warnings():
            # mlx-audio warns that word timestamps of a translation may be off: documented, not logged per request.
            warnings.filterwarnings("ignore", message="Word-level timestamps on translations")
            output = self.model.generate(request.samples, **generate_options(request))
        return to_transcript(output, request)

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "source": self.source, "translates": self.translates, **self.stats.snapshot()}

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.close()

    def _handle(self, job: Job[SpeechRequest]) -> Any:
        self.stats.waiting -= 1
        if job.cancelled.is_set():
            return None
        request = job.payload
        started = time.perf_counter()
        self.stats.running = 1
        try:
            result: Any = self.run(request)
            self.stats.requests += 1
            self.stats.audio_s += request.duration
            seconds = time.perf_counter() - started
            log_event(
                logger,
                "speech.done",
                task=request.task,
                audio_s=round(request.duration, 2),
                seconds=round(seconds, 2),
                realtime=round(request.duration / seconds, 1) if seconds else None,
            )
        except Exception as exc:  # a bad request fails alone, never the thread
            self.stats.errors += 1
            log_event(logger, "speech.error", logging.ERROR, error=repr(exc))
            result = exc
        finally:
            self.stats.running = 0
            self.stats.busy_s += time.perf_counter() - started
        return result


def missing_audio() -> str | None:
    """Why speech cannot be served here (the audio extra is not installed), or None."""
    missing = missing_message("audio", "speech to text")
    if missing:
        return missing
    from importlib.util import find_spec

    if find_spec("av") is None:
        return f"speech to text needs PyAV to decode uploads, which is not installed: {install_hint('audio')}"
    return None


def load_transcriber(spec: str, state_dir: Path, *, name: str, max_queue: int = 64) -> Transcriber:
    """The transcriber of ``spec``: a speech builtin (built once) or a local Whisper folder in MLX form."""
    missing = missing_audio()
    if missing:
        raise ModelLoadError(f"{spec}: {missing}")
    started = time.monotonic()
    if spec.startswith("builtin:"):
        from ..loading import builtin

        entry = builtin.get_builtin(spec[len("builtin:") :])
        if entry.kind != "speech":
            raise ModelLoadError(f"{spec} is not a speech model")
        folder = builtin.ensure_builtin(entry.name, state_dir)
    else:
        found = speech_folder(spec, state_dir)
        if found is None or not is_speech_spec(str(found)):
            raise ModelLoadError(f"{spec} is not a Whisper model folder (config.json model_type 'whisper')")
        folder = found.resolve()
    try:
        transcriber = Transcriber(folder, name=name, source=spec, max_queue=max_queue)
    except Exception as exc:  # missing weights, a tokenizer WhisperProcessor cannot read
        raise ModelLoadError(f"cannot load speech model {spec!r}: {type(exc).__name__}: {exc}") from exc
    log_event(logger, "speech.load", spec=spec, path=str(folder), seconds=round(time.monotonic() - started, 2))
    return transcriber
