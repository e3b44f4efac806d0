"""Reasoning, then tool calls, then stop strings: the same events however the model's text
arrives, because both streamed and whole responses read this one pipeline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vllmmlxd.engine.step.sequence import Chain, Sequence
from vllmmlxd.engine.types import Finished, GenerationRequest, ReasoningDelta, SamplingParams, TextDelta, ToolCallDelta
from vllmmlxd.parsers.reasoning import make_reasoning_parser
from vllmmlxd.parsers.tools import tool_parser_class

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
TEXT = (
    "<think>\nThe user wants the weather; I should call the tool.\n</think>\n\n"
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


class ChunkDetokenizer:
    """Token n is the n-th chunk of the text: the test picks where the text splits."""

    def __init__(self, chunks: list[str]):
        self.chunks, self.last_segment = chunks, ""

    def add_token(self, token):
        self.last_segment = self.chunks[token - 10]

    def finalize(self):
        self.last_segment = ""


def run(chunks: list[str], stop=()) -> list:
    request = GenerationRequest([1, 2], SamplingParams(max_tokens=10_000, stop=tuple(stop)), reasoning=True)
    chain = Chain(make_reasoning_parser("qwen3", "<|im_start|>assistant\n"), tool_parser_class("hermes")(TOOLS))
    seq = Sequence(request, asyncio.new_event_loop(), ChunkDetokenizer(chunks), {0}, {0}, parser=chain)
    reason = None
    for i in range(len(chunks)):
        reason = seq.feed(10 + i)
        if reason:
            break
    seq.finish(reason or "stop")
    return seq.take_events()


def merged(events) -> list[tuple[str, object]]:
    out: list[tuple[str, Any]] = []
    for e in events:
        if isinstance(e, (TextDelta, ReasoningDelta)):
            kind = "text" if isinstance(e, TextDelta) else "reasoning"
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + e.text)
            else:
                out.append((kind, e.text))
        elif isinstance(e, ToolCallDelta):
            out.append(("call", (e.index, e.name, e.arguments)))
        elif isinstance(e, Finished):
            out.append(("finish", e.reason))
    return out


EXPECTED = [
    ("reasoning", "The user wants the weather; I should call the tool."),
    ("text", "Checking.\n"),
    ("call", (0, "get_weather", '{"city": "Paris"}')),
    ("finish", "tool_calls"),
]


def test_a_think_section_then_a_call_whole():
    assert merged(run([TEXT])) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(TEXT)))
def test_a_think_section_then_a_call_split_anywhere(cut):
    assert merged(run([TEXT[:cut], TEXT[cut:]])) == EXPECTED


def test_one_character_at_a_time():
    assert merged(run(list(TEXT))) == EXPECTED


def test_a_stop_string_in_the_answer_ends_it_before_the_call():
    events = merged(run(list(TEXT), stop=["Checking"]))
    assert events == [EXPECTED[0], ("finish", "stop")]
