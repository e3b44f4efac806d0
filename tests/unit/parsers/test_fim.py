"""Fill-in-the-middle forms: found from a tokenizer's control tokens, written as each family's
documented prompt form, and chosen per entry (auto, a form, off)."""

from __future__ import annotations

import pytest

from vllmmlxd.api.openai.protocol import CompletionRequest
from vllmmlxd.api.openai.translate import completion_text
from vllmmlxd.errors import InvalidRequest
from vllmmlxd.parsers.fim import detect_fim, fim_prompt


@pytest.mark.parametrize(
    "vocab, form, written",
    [
        (
            {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "a"},
            "qwen",
            "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>",
        ),
        (
            {"<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>"},
            "starcoder",
            "<fim_prefix>P<fim_suffix>S<fim_middle>",
        ),
        (
            {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"},
            "deepseek",
            "<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>",
        ),
        ({"[SUFFIX]", "[PREFIX]", "[INST]"}, "codestral", "[SUFFIX]S[PREFIX]P"),
    ],
)
def test_each_form_is_found_by_its_tokens_and_written_as_documented(vocab, form, written):
    assert detect_fim(vocab) == form
    assert fim_prompt(form, "P", "S") == written


def test_a_partial_set_of_tokens_is_no_form():
    assert detect_fim({"<|fim_prefix|>", "<|fim_suffix|>"}) is None and detect_fim(set()) is None


def test_the_entry_chooses_auto_a_form_or_off():
    req = CompletionRequest(prompt="P", suffix="S")
    assert completion_text(req, "P", "auto", "starcoder") == "<fim_prefix>P<fim_suffix>S<fim_middle>"
    assert completion_text(req, "P", "qwen", None) == "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>"
    assert completion_text(CompletionRequest(prompt="P"), "P", "off", None) == "P"  # no suffix: as sent
    for setting, detected in (("off", "qwen"), ("auto", None)):
        with pytest.raises(InvalidRequest) as err:
            completion_text(req, "P", setting, detected)
        assert err.value.param == "suffix"
