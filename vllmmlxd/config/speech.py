"""A speech-to-text entry's upload limits: how large a file, how long its audio."""

from __future__ import annotations

from pydantic import Field

from .base import Strict


class SpeechConfig(Strict):
    """The upload limits of a speech entry (both read per request: live)."""

    max_audio_mb: float = Field(
        25.0, gt=0, description="speech models: an uploaded audio file's size at most (413 above; OpenAI's 25 MB)"
    )
    max_audio_s: float = Field(
        1800.0, gt=0, description="speech models: an upload's audio length in seconds at most (400 above)"
    )


# A speech entry's limits: every one is read per request (config/diff.py: live).
SPEECH_FIELDS = tuple(SpeechConfig.model_fields)
