"""GPT-OSS's harmony format, beyond the contract (test_tool_contract.py): calls stay text when
they are not to be read or name no offered tool; a prompt that opened a message's body; the
family told from a template or a tokenizer."""

from __future__ import annotations

from tests.unit.parsers.tool_families.harmony import FAMILY, PROMPT
from tests.unit.parsers.tool_split import run
from vllmmlxd.parsers.tools.auto import family_for_template
from vllmmlxd.parsers.tools.harmony import speaks_harmony

TOOLS = FAMILY.tools


def test_calls_stay_text_when_they_are_not_read_or_name_no_offered_tool():
    text, _ = FAMILY.calls["reasoning then a call, recipient after the channel"]
    assert run("harmony", TOOLS, [text], calls=False, prompt_tail=PROMPT) == [
        ("reasoning", "I should look it up."),
        ("content", '{"city":"Paris"}'),
    ]
    other = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    assert run("harmony", other, [text], prompt_tail=PROMPT)[1] == ("content", '{"city":"Paris"}')


def test_a_prompt_that_opened_the_answer_s_body_starts_there():
    assert run("harmony", TOOLS, ["Sunny."], prompt_tail=PROMPT + "<|channel|>final<|message|>") == [
        ("content", "Sunny.")
    ]
    assert run("harmony", TOOLS, ["Hm."], prompt_tail=PROMPT + "<|channel|>analysis<|message|>") == [
        ("reasoning", "Hm.")
    ]


def test_the_family_is_told_from_the_template_or_the_tokenizer():
    assert family_for_template("{{ '<|start|>assistant<|channel|>final<|message|>' }}") == "harmony"
    vocab = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "hello"}
    assert speaks_harmony(vocab) and family_for_template(None, vocab) == "harmony"
    assert not speaks_harmony(vocab - {"<|channel|>"})
