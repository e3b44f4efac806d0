"""The shared <think> state machine: prompt tails, holding back, flushing, and any text split any way."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmmlxd.parsers.reasoning import ReasoningParser
from vllmmlxd.parsers.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from vllmmlxd.parsers.reasoning.qwen3 import Qwen3ReasoningParser

FAMILIES = [Qwen3ReasoningParser, DeepSeekR1ReasoningParser]
TAILS = ["assistant\n", "assistant\n<think>\n", "<think>\n\n</think>\n\n", "</think>x<think>", "<think>x</think>", ""]


def reference(cls: type[ReasoningParser], tail: str, text: str) -> tuple[str, str]:
    """What the parser means, said with whole strings: (reasoning, content)."""
    tail = tail.rstrip()
    if tail.endswith("</think>"):
        return "", text.lstrip()
    body = text.lstrip()
    if body.startswith("<think>"):
        body = body[len("<think>") :]
    elif not (tail.endswith("<think>") or cls.starts_in_reasoning):
        return "", text.lstrip()
    reasoning, closed, content = body.partition("</think>")
    if not closed:
        return reasoning.lstrip(), ""  # never closed: what was held is flushed as reasoning
    return reasoning.strip(), content.lstrip()


def collect(parser: ReasoningParser, pieces: list[str]) -> list[tuple[str, str]]:
    return [(kind, text) for kind, text in [*(p for piece in pieces for p in parser.feed(piece)), *parser.finish()]]


def joined(out: list[tuple[str, str]]) -> tuple[str, str]:
    return "".join(t for k, t in out if k == "reasoning"), "".join(t for k, t in out if k == "content")


@pytest.mark.parametrize("cls", FAMILIES)
def test_feeding_nothing_returns_nothing(cls):
    parser = cls("assistant\n<think>\n")
    assert parser.feed("") == []
    assert parser.feed("a") == [("reasoning", "a")]
    assert parser.feed("") == [] and parser.finish() == []


@pytest.mark.parametrize("cls", FAMILIES)
def test_the_tail_decides_where_generation_starts(cls):
    assert cls("<|im_start|>assistant\n<think>\n").feed("hmm") == [("reasoning", "hmm")]
    assert cls("assistant\n<think>\n\n</think>\n\n").feed("hi") == [("content", "hi")]
    # A closed block earlier in the tail (a previous turn) does not close this one.
    assert cls("</think>\n\nok<|im_end|>\n<think>\n").feed("hmm") == [("reasoning", "hmm")]


def test_qwen3_without_a_block_is_content_and_r1_is_reasoning():
    assert Qwen3ReasoningParser("assistant\n").feed("hi") == [("content", "hi")]
    assert DeepSeekR1ReasoningParser("<｜Assistant｜>").feed("hmm") == [("reasoning", "hmm")]


def test_a_start_tag_in_pieces_is_held_then_dropped():
    parser = Qwen3ReasoningParser("assistant\n")
    assert parser.feed("\n<") == [] and parser.feed("thi") == [] and parser.feed("nk>\nA") == [("reasoning", "A")]


def test_a_held_start_that_never_completes_is_text():
    parser = Qwen3ReasoningParser("assistant\n")
    assert parser.feed("<thi") == [] and parser.feed("s> tag") == [("content", "<this> tag")]
    parser = Qwen3ReasoningParser("assistant\n")
    assert parser.feed("<th") == [] and parser.finish() == [("content", "<th")]


@pytest.mark.parametrize("cls", FAMILIES)
def test_a_held_end_that_never_completes_is_reasoning(cls):
    parser = cls("<think>\n")
    assert parser.feed("so\n</th") == [("reasoning", "so")]
    assert parser.finish() == [("reasoning", "\n</th")]


@pytest.mark.parametrize("cls", FAMILIES)
def test_reasoning_holds_only_a_possible_end(cls):
    parser = cls("<think>\n")
    assert parser.feed("a </") == [("reasoning", "a")]
    assert parser.feed("b") == [("reasoning", " </b")]
    assert parser.feed("c<") == [("reasoning", "c")]
    assert parser.feed("d") == [("reasoning", "<d")]


@pytest.mark.parametrize("cls", FAMILIES)
def test_content_is_never_held(cls):
    parser = cls("<think>\n</think>\n")
    assert parser.feed("x </th") == [("content", "x </th")]
    assert parser.feed("\n") == [("content", "\n")] and parser.finish() == []


@pytest.mark.parametrize("cls", FAMILIES)
def test_reasoning_and_content_in_one_piece_come_in_order(cls):
    out = cls("<think>\n").feed("r\n</think>\n\nc")
    assert out == [("reasoning", "r"), ("content", "c")]


@pytest.mark.parametrize("cls", FAMILIES)
def test_markers_are_the_two_tags(cls):
    assert cls.markers == frozenset({"<think>", "</think>"}) == cls("").markers


# Fragments that make marker edge cases likely: whole tags, split tags, near misses, whitespace.
_fragments = st.sampled_from(
    ["<think>", "</think>", "<", "</", "<th", "</th", "think", ">", "\n", "\n\n", " ", "a", "b."]
)


@settings(max_examples=500, deadline=None)
@given(
    cls=st.sampled_from(FAMILIES),
    tail=st.sampled_from(TAILS),
    parts=st.lists(_fragments, max_size=14),
    cuts=st.lists(st.integers(0, 80), max_size=10),
)
def test_any_text_split_any_way_gives_the_reference_result(cls, tail, parts, cuts):
    text = "".join(parts)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out = collect(cls(tail), pieces)
    assert all(t for _, t in out)
    kinds = [k for k, _ in out]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # reasoning never after content
    assert joined(out) == reference(cls, tail, text)


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from(FAMILIES), tail=st.sampled_from(TAILS), parts=st.lists(_fragments, min_size=1, max_size=14))
def test_nothing_is_held_unless_it_could_be_a_tag_or_its_edge(cls, tail, parts):
    text = "".join(parts)
    could_be_tag = any(text.endswith(tag[:n]) for tag in ("<think>", "</think>") for n in range(1, len(tag)))
    parser = cls(tail)
    parser.feed(text)
    if not (could_be_tag or text[-1].isspace()):
        assert parser.finish() == []
