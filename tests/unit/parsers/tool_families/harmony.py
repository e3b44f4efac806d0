"""GPT-OSS's harmony: reasoning, answer and calls, each a message on its channel; a message to
``functions.NAME`` is a call. The header of a message is no content; one call per generation."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("harmony")
# The end of the rendered prompt: the generation prompt opened the assistant's header.
PROMPT = "<|start|>user<|message|>Weather?<|end|><|start|>assistant"
CALL = call("get_weather", '{"city": "Paris"}')

FAMILY = Family(
    name="harmony",
    options={"prompt_tail": PROMPT},
    calls={
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
        "a preamble to no one is text, then a call": (
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
            ' <|constrain|>json<|message|>{"city": "Paris"}',
            [("content", "Checking."), CALL],
        ),
    },
    plain={
        "reasoning then the answer": (
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
            [("reasoning", "Easy."), ("content", "It is sunny.")],
        ),
        "a model that writes no harmony: its text is the answer": "Just text < here.",
    },
    malformed={
        "a call cut short by max_tokens is given back as text": (
            '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
            [("content", '{"city": "Pa')],
        ),
    },
    unknown_tool={
        "a built-in tool's call is given back as text": (
            "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis to=browser.search "
            '<|message|>{"query": "Paris"}',
            [("reasoning", "Search."), ("content", '{"query": "Paris"}')],
        ),
        "a call of a function not offered is given back as text": (
            '<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{"path": "/"}',
            [("content", '{"path": "/"}')],
        ),
    },
    render=("get_weather", {"city": "Rome"}),
    markers=frozenset(
        {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"}
    ),
    # Its <|call|> ends generation: a grammar of more than one call is never asked for.
    parallel=False,
    two_calls=(P.render_call("get_time", {}) + "<|end|><|start|>assistant" + P.render_call("get_time", {}),),
    grammar_accepts=(P.render_call("get_weather", {"city": "Paris"}),),
    grammar_refuses=('<|channel|>final<|message|>{"city": "Paris"}',),
)
