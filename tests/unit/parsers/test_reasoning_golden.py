"""Golden outputs of each family: the same (reasoning, content) however the text is split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmmlxd.parsers.reasoning import make_reasoning_parser

# The last characters of the prompts the chat templates render.
QWEN_PLAIN = "What is 17 * 23?<|im_end|>\n<|im_start|>assistant\n"  # thinking on, older template
QWEN_OPENED = "<|im_end|>\n<|im_start|>assistant\n<think>\n"  # Qwen3-2507 Thinking, QwQ
QWEN_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking: false
R1_OPENED = "many r's in strawberry?<｜Assistant｜><think>\n"
R1_PLAIN = "many r's in strawberry?<｜Assistant｜>"  # older template: the model opens the block
R1_OFF = "<｜Assistant｜><think>\n\n</think>\n\n"

QWEN_REASONING = (
    "Okay, the user is asking for 17 times 23. Let me break it down: 17 * 20 = 340, and 17 * 3 = 51.\n\n"
    "Adding them gives 340 + 51 = 391. Let me check: 23 * 17 = 230 + 161 = 391. Yes."
)
R1_REASONING = (
    "Okay, let's see. The word is strawberry: s-t-r-a-w-b-e-r-r-y.\n"
    "The r's are at positions 3, 8 and 9, so there are three."
)

# (family, prompt tail, generated text, expected reasoning, expected content)
GOLDEN = {
    "qwen3-model-writes-think": (
        "qwen3",
        QWEN_PLAIN,
        f"<think>\n{QWEN_REASONING}\n</think>\n\n17 × 23 = **391**.",
        QWEN_REASONING,
        "17 × 23 = **391**.",
    ),
    "qwen3-prompt-opened-think": (
        "qwen3",
        QWEN_OPENED,
        f"{QWEN_REASONING}\n</think>\n\n17 × 23 = **391**.",
        QWEN_REASONING,
        "17 × 23 = **391**.",
    ),
    "qwen3-thinking-off": (
        "qwen3",
        QWEN_OFF,
        "Qwen3 wraps its reasoning in `<think>` and `</think>` tags.",
        "",
        "Qwen3 wraps its reasoning in `<think>` and `</think>` tags.",
    ),
    "qwen3-answers-without-thinking": (
        "qwen3",
        QWEN_PLAIN,
        "\n\n17 × 23 = 391. Tags like </think> in an answer are answer text.",
        "",
        "17 × 23 = 391. Tags like </think> in an answer are answer text.",
    ),
    "qwen3-empty-think": (
        "qwen3",
        QWEN_PLAIN,
        "<think>\n\n</think>\n\nAn old silent pond,\na frog jumps into the pond,\nsplash! Silence again.",
        "",
        "An old silent pond,\na frog jumps into the pond,\nsplash! Silence again.",
    ),
    "qwen3-never-closes": (
        "qwen3",
        QWEN_PLAIN,
        "<think>\nThe user wants a proof that √2 is irrational. Suppose √2 = p/q in lowest terms, then",
        "The user wants a proof that √2 is irrational. Suppose √2 = p/q in lowest terms, then",
        "",
    ),
    "qwen3-tag-inside-reasoning": (
        "qwen3",
        QWEN_OPENED,
        "The user asks what <think> means.\nIt opens a block; </thinking> is not the end tag.\n"
        "</think>\n\nIt opens a reasoning block.",
        "The user asks what <think> means.\nIt opens a block; </thinking> is not the end tag.",
        "It opens a reasoning block.",
    ),
    "r1-normal": (
        "deepseek_r1",
        R1_OPENED,
        f'{R1_REASONING}\n</think>\n\nThere are **3** r\'s in "strawberry".',
        R1_REASONING,
        'There are **3** r\'s in "strawberry".',
    ),
    "r1-writes-think-too": (
        "deepseek_r1",
        R1_OPENED,
        f'<think>\n{R1_REASONING}\n</think>\n\nThere are **3** r\'s in "strawberry".',
        R1_REASONING,
        'There are **3** r\'s in "strawberry".',
    ),
    "r1-older-template-writes-think": (
        "deepseek_r1",
        R1_PLAIN,
        f'<think>\n{R1_REASONING}\n\n</think>\n\nThere are **3** r\'s in "strawberry".',
        R1_REASONING,
        'There are **3** r\'s in "strawberry".',
    ),
    "r1-older-template-no-tags": (
        "deepseek_r1",
        R1_PLAIN,
        f"{R1_REASONING}</think>There are **3** r's.",
        R1_REASONING,
        "There are **3** r's.",
    ),
    "r1-never-closes": (
        "deepseek_r1",
        R1_OPENED,
        "Okay, let me integrate x^2 from 0 to 1. The antiderivative is x^3/3, so the value is",
        "Okay, let me integrate x^2 from 0 to 1. The antiderivative is x^3/3, so the value is",
        "",
    ),
    "r1-thinking-disabled": (
        "deepseek_r1",
        R1_OFF,
        "Paris is the capital of France.</think> stays in the answer.",
        "",
        "Paris is the capital of France.</think> stays in the answer.",
    ),
    "r1-second-end-tag-is-content": (
        "deepseek_r1",
        R1_OPENED,
        "Short.\n</think>\n\nThe tag </think> closes reasoning.",
        "Short.",
        "The tag </think> closes reasoning.",
    ),
}


def run(family: str, tail: str, pieces: list[str]) -> tuple[str, str, list[str]]:
    """Feed ``pieces``; return the reasoning, the content and the kinds in order (runs merged)."""
    parser = make_reasoning_parser(family, tail)
    out = [p for piece in pieces for p in parser.feed(piece)] + parser.finish()
    assert all(text for _, text in out), out  # never an empty piece
    kinds: list[str] = []
    for kind, _ in out:
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    reasoning = "".join(t for k, t in out if k == "reasoning")
    content = "".join(t for k, t in out if k == "content")
    return reasoning, content, kinds


def expected(case: str) -> tuple[str, str, list[str]]:
    _, _, _, reasoning, content = GOLDEN[case]
    return reasoning, content, [k for k, t in (("reasoning", reasoning), ("content", content)) if t]


@pytest.mark.parametrize("case", GOLDEN)
def test_whole_text(case):
    family, tail, text, _, _ = GOLDEN[case]
    assert run(family, tail, [text]) == expected(case)


@pytest.mark.parametrize("case", GOLDEN)
def test_one_character_at_a_time(case):
    family, tail, text, _, _ = GOLDEN[case]
    assert run(family, tail, list(text)) == expected(case)


@pytest.mark.parametrize("case", GOLDEN)
def test_every_two_piece_split(case):
    family, tail, text, _, _ = GOLDEN[case]
    for i in range(len(text) + 1):
        assert run(family, tail, [text[:i], text[i:]]) == expected(case), f"split at {i}: {text[:i]!r}"


@pytest.mark.parametrize("case", GOLDEN)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_random_multi_piece_splits(case, data):
    family, tail, text, _, _ = GOLDEN[case]
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    bounds = sorted({0, len(text), *cuts})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(family, tail, pieces) == expected(case)


@pytest.mark.parametrize("family,tail", [("qwen3", QWEN_OPENED), ("deepseek_r1", R1_OPENED)])
def test_end_tag_split_across_tokens_streams_reasoning_first(family, tail):
    parser = make_reasoning_parser(family, tail)
    fed = [parser.feed(t) for t in ["Okay", ",", " so", "\n", "</", "think", ">", "\n\n", "The", " answer"]]
    assert fed == [
        [("reasoning", "Okay")],
        [("reasoning", ",")],
        [("reasoning", " so")],
        [],  # "\n" may be the edge before </think>
        [],
        [],
        [],
        [],  # content's leading newlines go
        [("content", "The")],
        [("content", " answer")],
    ]
    assert parser.finish() == []
