"""GPT-OSS's harmony format (parsers/tools/harmony.py): reasoning, answer and calls by channel,
whole and split at every boundary; what is not a call of an offered function stays text; the
family is told from a template or a tokenizer; the grammar of a forced call."""

from __future__ import annotations

import pytest

from tests.support.grammar import accepts
from vllmmlxd.parsers.tools import ToolCall
from vllmmlxd.parsers.tools.auto import family_for_template
from vllmmlxd.parsers.tools.harmony import HarmonyParser, speaks_harmony

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
PROMPT = "<|start|>user<|message|>Weather?<|end|><|start|>assistant"
CALL = ("tool_call", ToolCall("get_weather", '{"city": "Paris"}'))

GOLDEN = {
    "reasoning then a call, recipient after the channel": (
        "<|channel|>analysis<|message|>I should look it up.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}',
        [("reasoning", "I should look it up."), CALL],
    ),
    "recipient in the role's header": (
        "<|channel|>analysis<|message|>Look.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
        '<|message|>{"city": "Paris"}',
        [("reasoning", "Look."), CALL],
    ),
    "reasoning then the answer": (
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
        [("reasoning", "Easy."), ("content", "It is sunny.")],
    ),
    "a preamble to no one is text, then a call": (
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
        ' <|constrain|>json<|message|>{"city": "Paris"}',
        [("content", "Checking."), CALL],
    ),
    "a built-in tool's call is given back as text": (
        "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis to=browser.search "
        '<|message|>{"query": "Paris"}',
        [("reasoning", "Search."), ("content", '{"query": "Paris"}')],
    ),
    "a call cut short by max_tokens is given back as text": (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
        [("content", '{"city": "Pa')],
    ),
    "a model that writes no harmony: its text is the answer": ("Just text < here.", [("content", "Just text < here.")]),
}


def run(chunks: list[str], *, tools=TOOLS, calls=True, prompt=PROMPT) -> list[tuple[str, object]]:
    parser = HarmonyParser(tools, calls=calls, prompt_tail=prompt)
    pieces = [p for chunk in chunks for p in parser.feed(chunk)] + parser.finish()
    merged: list[tuple[str, object]] = []
    for kind, value in pieces:
        if kind != "tool_call" and merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        elif value:
            merged.append((kind, value))
    return merged


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_transcripts_whole_and_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert run([text]) == expected
    assert run(list(text)) == expected, "one character at a time"
    for i in range(1, len(text)):
        assert run([text[:i], text[i:]]) == expected, f"split at {i}: {text[:i]!r}"


def test_calls_stay_text_when_they_are_not_read_or_name_no_offered_tool():
    text, _ = GOLDEN["reasoning then a call, recipient after the channel"]
    assert run([text], calls=False) == [("reasoning", "I should look it up."), ("content", '{"city":"Paris"}')]
    other = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    assert run([text], tools=other)[1] == ("content", '{"city":"Paris"}')


def test_a_prompt_that_opened_the_answer_s_body_starts_there():
    assert run(["Sunny."], prompt=PROMPT + "<|channel|>final<|message|>") == [("content", "Sunny.")]
    assert run(["Hm."], prompt=PROMPT + "<|channel|>analysis<|message|>") == [("reasoning", "Hm.")]


def test_the_family_is_told_from_the_template_or_the_tokenizer():
    assert family_for_template("{{ '<|start|>assistant<|channel|>final<|message|>' }}") == "harmony"
    vocab = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "hello"}
    assert speaks_harmony(vocab) and family_for_template(None, vocab) == "harmony"
    assert not speaks_harmony(vocab - {"<|channel|>"})


def test_a_forced_call_s_grammar_holds_the_header_and_the_arguments():
    grammar = HarmonyParser.grammar(TOOLS)
    assert accepts(grammar, HarmonyParser.render_call("get_weather", {"city": "Paris"}))
    assert not accepts(grammar, '<|channel|>final<|message|>{"city": "Paris"}')
