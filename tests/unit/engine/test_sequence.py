"""sequence.py and the scheduler's StepTimer: one request's events, and the prefill chunk size."""

from __future__ import annotations

import asyncio

from vllmmlxd.engine.step.sequence import Sequence
from vllmmlxd.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta

EOS, SPECIAL = 0, 1


class LetterDetokenizer:
    """Token n is the letter chr(ord('a') + n - 2); enough to test grouping and stops."""

    def __init__(self):
        self.last_segment = ""

    def add_token(self, token):
        self.last_segment = chr(ord("a") + token - 2)

    def finalize(self):
        self.last_segment = ""


def seq(max_tokens=10, stop=(), stream_interval=1, ignore_eos=False) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, stop=tuple(stop), ignore_eos=ignore_eos)
    request = GenerationRequest([5, 6, 7], params, stream_interval=stream_interval)
    return Sequence(request, asyncio.new_event_loop(), LetterDetokenizer(), {EOS}, {EOS, SPECIAL})


def text(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_tokens_become_text_and_the_finish_carries_usage():
    s = seq()
    assert [s.feed(t) for t in (2, 3, 4)] == [None, None, None]
    s.finish("stop")
    events = s.take_events()
    assert text(events) == "abc" and isinstance(events[-1], Finished)
    assert (
        events[-1].reason == "stop" and events[-1].usage.prompt_tokens == 3 and events[-1].usage.completion_tokens == 3
    )
    assert s.take_events() == []


def test_eos_ends_unless_ignored():
    assert seq().feed(EOS) == "stop"
    s = seq(ignore_eos=True)
    assert s.feed(EOS) is None and s.produced == 1


def test_max_tokens_ends_with_length():
    s = seq(max_tokens=2)
    assert s.feed(2) is None and s.feed(3) == "length"


def test_a_stop_string_across_tokens_is_cut():
    s = seq(stop=["cd"])
    assert [s.feed(t) for t in (2, 3, 4)] == [None, None, None]
    assert s.feed(5) == "stop"
    s.finish("stop")
    assert text(s.take_events()) == "ab"


def test_stream_interval_groups_tokens():
    s = seq(stream_interval=3)
    for t in (2, 3, 4, 5):
        s.feed(t)
    deltas = [e for e in s.take_events() if isinstance(e, TextDelta)]
    assert [(d.text, d.token_count) for d in deltas] == [("abc", 3)]


def test_special_tokens_are_counted_but_not_shown():
    s = seq()
    s.feed(SPECIAL)
    s.feed(2)
    s.finish("length")
    events = s.take_events()
    assert text(events) == "a" and events[-1].usage.completion_tokens == 2


def test_cancelled_drops_held_text_and_finish_is_idempotent():
    s = seq(stop=["bz"])
    s.feed(2)
    s.feed(3)  # "b" held back: it may start the stop string
    s.take_events()
    s.finish("cancelled")
    s.finish("stop")
    events = s.take_events()
    assert len(events) == 1 and events[0].reason == "cancelled"


def test_progress_records_the_cache_hit_and_the_first_token():
    s = seq()
    s.start(cached_tokens=2, hit_type="prefix")
    assert s.progress.phase == "prefill"
    s.feed(2)
    snap = s.progress.snapshot()
    assert snap["phase"] == "generation" and snap["cache_hit_type"] == "prefix" and snap["cached_tokens"] == 2
