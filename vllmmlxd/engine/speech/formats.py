"""A transcript as each of OpenAI's ``response_format`` values gives it: pure functions over plain data.

``json`` and ``verbose_json`` are dicts (the API layer sends them), ``text``, ``srt`` and ``vtt``
strings. Numbers the engine could not compute (NaN, from a window decoded to nothing) are sent
as 0.0: JSON has no NaN, and OpenAI's types say number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TEXT_FORMATS = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}

# ISO 639-1 code -> Whisper's English name, as verbose_json's language gives it ("english").
LANGUAGE_NAMES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian", "kn": "kannada",
    "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be": "belarusian",
    "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}  # fmt: skip
LANGUAGE_CODES = {name: code for code, name in LANGUAGE_NAMES.items()}


@dataclass(frozen=True)
class Transcript:
    """What the engine made of one file: its text, the detected (or given) language code, the
    audio's length, and the segments as mlx-audio gives them (``words`` in each when asked)."""

    text: str
    language: str
    duration: float
    task: str = "transcribe"
    segments: list[dict[str, Any]] = field(default_factory=list)


def language_code(value: str | None) -> str | None:
    """A request's ``language`` as Whisper's code ("en", "english" and "English" alike); None: detect.
    ValueError naming the value when Whisper has no such language."""
    if value is None or not value.strip():
        return None
    text = value.strip().lower()
    if text in LANGUAGE_NAMES:
        return text
    if text in LANGUAGE_CODES:
        return LANGUAGE_CODES[text]
    raise ValueError(f"language {value!r} is not one Whisper knows; give an ISO-639-1 code such as 'en'")


def number(value: Any) -> float:
    """A float JSON can carry: NaN and infinities as 0.0."""
    x = float(value)
    return x if math.isfinite(x) else 0.0


def timestamp(seconds: float, separator: str) -> str:
    """``HH:MM:SS,mmm`` (SubRip: ``separator`` ",") or ``HH:MM:SS.mmm`` (WebVTT: ".")."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def _cues(transcript: Transcript) -> list[tuple[float, float, str]]:
    # A segment decoded to nothing (mlx-audio clears them) makes no cue.
    return [(s["start"], s["end"], s["text"].strip()) for s in transcript.segments if s["text"].strip()]


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues from 1, a blank line after each."""
    blocks = [
        f"{i}\n{timestamp(start, ',')} --> {timestamp(end, ',')}\n{text}\n"
        for i, (start, end, text) in enumerate(_cues(transcript), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: the header, then one cue per segment."""
    blocks = [f"{timestamp(start, '.')} --> {timestamp(end, '.')}\n{text}\n" for start, end, text in _cues(transcript)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def usage(transcript: Transcript) -> dict[str, Any]:
    """What a whisper-1 response says it used: the audio's seconds."""
    return {"type": "duration", "seconds": number(round(transcript.duration, 3))}


def to_json(transcript: Transcript) -> dict[str, Any]:
    return {"text": transcript.text, "usage": usage(transcript)}


def segment_json(segment: dict[str, Any]) -> dict[str, Any]:
    """One segment in OpenAI's TranscriptionSegment shape."""
    return {
        "id": int(segment["id"]),
        "seek": int(segment["seek"]),
        "start": number(segment["start"]),
        "end": number(segment["end"]),
        "text": segment["text"],
        "tokens": [int(t) for t in segment["tokens"]],
        "temperature": number(segment["temperature"]),
        "avg_logprob": number(segment["avg_logprob"]),
        "compression_ratio": number(segment["compression_ratio"]),
        "no_speech_prob": number(segment["no_speech_prob"]),
    }


def to_verbose_json(transcript: Transcript, *, segments: bool = True, words: bool = False) -> dict[str, Any]:
    """verbose_json: task, language (its English name), duration, text, segments, words when asked, usage."""
    body: dict[str, Any] = {
        "task": transcript.task,
        "language": LANGUAGE_NAMES.get(transcript.language, transcript.language),
        "duration": number(round(transcript.duration, 3)),
        "text": transcript.text,
    }
    if segments:
        body["segments"] = [segment_json(s) for s in transcript.segments]
    if words:
        body["words"] = [
            {"word": w["word"], "start": number(w["start"]), "end": number(w["end"])}
            for s in transcript.segments
            for w in s.get("words", [])
        ]
    body["usage"] = usage(transcript)
    return body


def render(transcript: Transcript, response_format: str, granularities: tuple[str, ...] = ()) -> dict | str:
    """The body of ``response_format``: a dict for the JSON formats, text for the others."""
    if response_format == "json":
        return to_json(transcript)
    if response_format == "verbose_json":
        # OpenAI: segments by default; asking for words alone leaves segments out.
        want_segments = not granularities or "segment" in granularities
        return to_verbose_json(transcript, segments=want_segments, words="word" in granularities)
    if response_format == "srt":
        return to_srt(transcript)
    if response_format == "vtt":
        return to_vtt(transcript)
    return transcript.text


def stream_events(transcript: Transcript) -> list[dict[str, Any]]:
    """The SSE events of a streamed transcription: one ``transcript.text.delta`` per segment, then
    ``transcript.text.done`` with the whole text; the deltas add up to it."""
    deltas = []
    sent = ""
    for s in transcript.segments:
        piece = s["text"] if sent else s["text"].lstrip()  # the text is stripped at its ends
        if piece and transcript.text.startswith(sent + piece):
            deltas.append({"type": "transcript.text.delta", "delta": piece})
            sent += piece
    if sent != transcript.text:  # segments that do not add up to the text: the rest in one delta
        deltas.append({"type": "transcript.text.delta", "delta": transcript.text[len(sent) :]})
    return [*deltas, {"type": "transcript.text.done", "text": transcript.text}]
