import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmmlxd.engine.text.stops import StopMatcher


def run(stops, pieces):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    return out + m.flush(), m.stopped


def test_no_stops_passes_text_through():
    assert run([], ["a", "b"]) == ("ab", False)


def test_stop_inside_one_piece_cuts_before_it():
    assert run(["END"], ["hello END world"]) == ("hello ", True)


@pytest.mark.parametrize("pieces", [["hel", "lo E", "N", "D more"], ["hello ", "E", "ND"], list("hello END")])
def test_stop_split_across_pieces_is_found_and_never_emitted(pieces):
    m = StopMatcher(["END"])
    emitted = []
    for p in pieces:
        emitted.append(m.feed(p))
        assert "E" not in "".join(emitted).replace("hello", "")
    assert "".join(emitted) == "hello "
    assert m.stopped


def test_partial_match_that_fails_is_released():
    assert run(["END"], ["EN", "x"]) == ("ENx", False)


def test_held_partial_is_flushed_at_the_end():
    m = StopMatcher(["END"])
    assert m.feed("abcE") == "abc"
    assert m.flush() == "E"


def test_earliest_of_several_stops_wins():
    assert run(["world", "lo"], ["hello world"]) == ("hel", True)


def test_nothing_after_stop():
    m = StopMatcher(["x"])
    m.feed("ax")
    assert m.feed("more") == "" and m.flush() == ""


def test_empty_stop_strings_are_ignored():
    assert run(["", "z"], ["abc"]) == ("abc", False)


_alphabet = st.sampled_from("ab c\n")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(_alphabet, max_size=40),
    stops=st.lists(st.text(_alphabet, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_any_split_gives_the_same_result_as_the_whole_text(text, stops, cuts):
    """However the text is split into pieces, the output is the text up to the earliest stop."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(hits)] if hits else text
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    m = StopMatcher(stops)
    out = ""
    for p in pieces:
        out += m.feed(p)
        assert expected.startswith(out)  # never emits anything it would have to take back
    out += m.flush()
    assert out == expected and m.stopped == bool(hits)


def test_a_longer_stop_that_starts_earlier_is_waited_for():
    # "b" is complete at 2, but "aba" (from 1) is still possible: nothing past 1 may go out yet.
    m = StopMatcher(["b", "aba"])
    assert m.feed("aab") == "a" and not m.stopped
    assert m.feed("a") == "" and m.stopped
    m = StopMatcher(["b", "aba"])
    assert m.feed("aab") == "a"
    assert m.feed("c") == "a" and m.stopped  # "aba" did not come: the cut is at "b"
    m = StopMatcher(["b", "aba"])
    assert m.feed("aab") == "a" and m.flush() == "a" and m.stopped  # generation ended meanwhile


def test_the_matched_stop_is_remembered():
    m = StopMatcher(["END", "x"])
    assert m.feed("abc EN") == "abc " and m.matched is None
    assert m.feed("D more") == "" and m.stopped and m.matched == "END"
    m = StopMatcher(["ab", "abc"])
    m.feed("zzabcd")
    assert m.matched == "abc"
