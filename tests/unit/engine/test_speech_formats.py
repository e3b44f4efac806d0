"""A transcript in each of OpenAI's response formats: SubRip and WebVTT timestamps and cues,
verbose_json's fields and types as OpenAI's API reference (and its SDK's types) give them,
the stream's deltas adding up to the done event's text, and request languages read as Whisper's codes."""

from __future__ import annotations

import math

import pytest
from openai.types.audio import TranscriptionVerbose
from openai.types.audio.transcription_text_delta_event import TranscriptionTextDeltaEvent
from openai.types.audio.transcription_text_done_event import TranscriptionTextDoneEvent

from vllmmlxd.engine.speech.formats import (
    Transcript,
    language_code,
    render,
    stream_events,
    timestamp,
    to_srt,
    to_vtt,
)


def segment(i: int, start: float, end: float, text: str, **extra) -> dict:
    return {
        "id": i,
        "seek": int(start * 100),
        "start": start,
        "end": end,
        "text": text,
        "tokens": [50364, 100 + i, 50400],
        "temperature": 0.0,
        "avg_logprob": -0.25,
        "compression_ratio": 1.2,
        "no_speech_prob": 0.01,
        **extra,
    }


WORDS = [{"word": " Hello", "start": 0.0, "end": 0.5, "probability": 0.9}]
TRANSCRIPT = Transcript(
    text="Hello there. General Kenobi.",
    language="en",
    duration=3725.5,
    segments=[
        segment(0, 0.0, 1.5, " Hello there.", words=WORDS),
        segment(1, 3723.25, 3725.5, " General Kenobi.", words=[]),
        segment(2, 3725.5, 3725.5, "", words=[]),  # mlx-audio clears an instantaneous segment's text
    ],
)


@pytest.mark.parametrize(
    ("seconds", "srt", "vtt"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (1.5, "00:00:01,500", "00:00:01.500"),
        (61.0015, "00:01:01,002", "00:01:01.002"),
        (3725.999, "01:02:05,999", "01:02:05.999"),
        (3599.9996, "01:00:00,000", "01:00:00.000"),  # rounds up across every unit
        (-0.01, "00:00:00,000", "00:00:00.000"),
    ],
)
def test_timestamps_are_hours_minutes_seconds_and_milliseconds(seconds, srt, vtt):
    assert timestamp(seconds, ",") == srt and timestamp(seconds, ".") == vtt


def test_srt_numbers_its_cues_from_one_and_skips_empty_segments():
    assert to_srt(TRANSCRIPT) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n2\n01:02:03,250 --> 01:02:05,500\nGeneral Kenobi.\n"
    )


def test_vtt_starts_with_its_header_and_uses_dots():
    assert to_vtt(TRANSCRIPT) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n01:02:03.250 --> 01:02:05.500\nGeneral Kenobi.\n"
    )


def test_json_and_text_carry_the_text():
    assert render(TRANSCRIPT, "json") == {
        "text": "Hello there. General Kenobi.",
        "usage": {"type": "duration", "seconds": 3725.5},
    }
    assert render(TRANSCRIPT, "text") == "Hello there. General Kenobi."


SEGMENT_TYPES = {
    "id": int,
    "seek": int,
    "start": float,
    "end": float,
    "text": str,
    "tokens": list,
    "temperature": float,
    "avg_logprob": float,
    "compression_ratio": float,
    "no_speech_prob": float,
}


def test_verbose_json_has_openais_fields_and_types():
    body = render(TRANSCRIPT, "verbose_json")
    assert isinstance(body, dict)
    assert list(body) == ["task", "language", "duration", "text", "segments", "usage"]
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert isinstance(body["duration"], float) and body["text"] == TRANSCRIPT.text
    for seg in body["segments"]:
        assert set(seg) == set(SEGMENT_TYPES)
        for name, kind in SEGMENT_TYPES.items():
            assert type(seg[name]) is kind, name
        assert all(type(t) is int for t in seg["tokens"])
    assert body["usage"] == {"type": "duration", "seconds": 3725.5}
    parsed = TranscriptionVerbose.model_validate(body)  # the official SDK's own type
    assert parsed.segments is not None and parsed.segments[1].start == 3723.25 and parsed.words is None


def test_word_granularity_adds_words_and_alone_leaves_segments_out():
    both = render(TRANSCRIPT, "verbose_json", ("segment", "word"))
    assert isinstance(both, dict) and "segments" in both
    assert both["words"] == [{"word": " Hello", "start": 0.0, "end": 0.5}]
    words = render(TRANSCRIPT, "verbose_json", ("word",))
    assert isinstance(words, dict) and "segments" not in words and len(words["words"]) == 1
    assert TranscriptionVerbose.model_validate(words).words[0].word == " Hello"


def test_numbers_json_cannot_carry_are_sent_as_zero():
    odd = Transcript("x", "en", 1.0, segments=[segment(0, 0.0, 1.0, "x", avg_logprob=math.nan)])
    body = render(odd, "verbose_json")
    assert isinstance(body, dict) and body["segments"][0]["avg_logprob"] == 0.0


def test_a_translation_says_its_task_and_the_source_language():
    body = render(Transcript("hi", "fr", 1.0, task="translate"), "verbose_json")
    assert isinstance(body, dict) and body["task"] == "translate" and body["language"] == "french"


def test_the_stream_is_one_delta_per_segment_then_done_with_the_whole_text():
    events = stream_events(TRANSCRIPT)
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"] == TRANSCRIPT.text
    for event in events[:-1]:
        TranscriptionTextDeltaEvent.model_validate(event)
    TranscriptionTextDoneEvent.model_validate(events[-1])


def test_segments_that_do_not_add_up_to_the_text_end_in_one_delta_that_does():
    odd = Transcript("ab\ufffdc", "en", 1.0, segments=[segment(0, 0, 1, " ab"), segment(1, 1, 2, "\ufffd\ufffdc")])
    events = stream_events(odd)
    assert "".join(e["delta"] for e in events[:-1]) == "ab\ufffdc"


@pytest.mark.parametrize(("given", "code"), [("en", "en"), ("English", "en"), (" fr ", "fr"), (None, None), ("", None)])
def test_languages_are_whisper_codes_or_names(given, code):
    assert language_code(given) == code


def test_an_unknown_language_is_refused_by_name():
    with pytest.raises(ValueError, match="'klingon'"):
        language_code("klingon")
