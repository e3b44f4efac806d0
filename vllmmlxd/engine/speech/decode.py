"""Uploaded audio to Whisper's input: 16 kHz mono float32 samples, decoded with PyAV.

PyAV's wheels carry FFmpeg's libraries, so wav, mp3, m4a/aac, flac, ogg/opus and webm/opus
decode with nothing else installed. Decoding stops as soon as the audio passes the entry's
duration limit: a long file is refused without being decoded whole. Errors are the client's
(400, naming the problem); nothing here can take the worker down.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ...errors import InvalidRequest, PayloadTooLarge

SAMPLE_RATE = 16000  # Whisper's


@dataclass(frozen=True)
class AudioLimits:
    """An entry's upload limits: bytes of the file, seconds of audio."""

    max_bytes: int
    max_seconds: float


def check_size(size: int, limits: AudioLimits) -> None:
    """413 when the upload is over the entry's file limit."""
    if size > limits.max_bytes:
        raise PayloadTooLarge(
            f"the audio file is {size / 1024**2:.1f} MB; this model takes files up to "
            f"{limits.max_bytes / 1024**2:g} MB (max_audio_mb)",
            param="file",
        )


def too_long(seconds: float, limits: AudioLimits) -> InvalidRequest:
    return InvalidRequest(
        f"the audio is longer than {limits.max_seconds:g} seconds, this model's limit (max_audio_s); "
        "send a shorter file",
        param="file",
        code="audio_too_long",
    )


def decode_audio(data: bytes, limits: AudioLimits) -> np.ndarray:
    """The file's first audio stream as 16 kHz mono float32; InvalidRequest when it cannot be read."""
    import av

    check_size(len(data), limits)
    if not data:
        raise InvalidRequest("the audio file is empty", param="file")
    cap = int(limits.max_seconds * SAMPLE_RATE)
    chunks: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise InvalidRequest("the file has no audio stream", param="file")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    total = _keep(chunks, out.to_ndarray(), total, cap, limits)
            for out in resampler.resample(None):  # what the resampler still holds
                total = _keep(chunks, out.to_ndarray(), total, cap, limits)
    except InvalidRequest:
        raise
    except (av.FFmpegError, ValueError, OSError, EOFError, IndexError) as exc:
        raise InvalidRequest(
            f"the file could not be decoded as audio ({type(exc).__name__}: {_reason(exc)}); "
            "send wav, mp3, m4a, flac, ogg or webm",
            param="file",
            code="invalid_audio",
        ) from None
    if total == 0:
        raise InvalidRequest("the file holds no audio samples", param="file", code="invalid_audio")
    return np.concatenate(chunks).astype(np.float32, copy=False)


def _keep(chunks: list[np.ndarray], samples: np.ndarray, total: int, cap: int, limits: AudioLimits) -> int:
    flat = samples.reshape(-1)  # packed mono float: one row
    total += flat.size
    if total > cap:
        raise too_long(total / SAMPLE_RATE, limits)
    chunks.append(flat)
    return total


def _reason(exc: BaseException) -> str:
    # FFmpeg's message, without the in-memory file's name it would quote.
    return (getattr(exc, "strerror", None) or str(exc) or "unreadable").strip()[:200]
