"""chat_template_kwargs: only the switches the model's template reads, with small scalar values."""

from __future__ import annotations

import pytest

from vllmmlxd.api.template_kwargs import checked_template_kwargs
from vllmmlxd.engine.text.template_vars import template_switches
from vllmmlxd.errors import InvalidRequest

TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}{% if enable_thinking is false %}<think></think>{% endif %}{% endif %}"
    "{{ reasoning_effort }}{% for i in range(3) %}{% endfor %}"
)


def test_the_switches_are_what_the_template_reads_less_the_machinery():
    assert template_switches(TEMPLATE) == {"enable_thinking", "reasoning_effort"}
    assert template_switches({"default": TEMPLATE, "tool_use": "{{ tools }}{{ builtin }}"}) == {
        "enable_thinking",
        "reasoning_effort",
        "builtin",
    }
    assert template_switches("{% broken") == {"enable_thinking"}  # unreadable: the common switch only
    assert template_switches(None) == {"enable_thinking"}


SWITCHES = frozenset({"enable_thinking", "reasoning_effort"})


def test_switches_with_scalars_pass():
    kw = {"enable_thinking": False, "reasoning_effort": "low"}
    assert checked_template_kwargs(kw, SWITCHES) == kw and checked_template_kwargs(None, SWITCHES) == {}


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"chat_template": "{% for i in range(10**9) %}x{% endfor %}"}, "chat_template_kwargs.chat_template"),
        ({"padding": "max_length"}, "chat_template_kwargs.padding"),
        ({"max_length": 2**31}, "chat_template_kwargs.max_length"),
        ({"tokenize": False}, "chat_template_kwargs.tokenize"),
        ({"enable_thinking": {"nested": [1]}}, "chat_template_kwargs.enable_thinking"),
        ({"reasoning_effort": "x" * 5000}, "chat_template_kwargs.reasoning_effort"),
        ({"reasoning_effort": float("nan")}, "chat_template_kwargs.reasoning_effort"),
        ({"reasoning_effort": 10**40}, "chat_template_kwargs.reasoning_effort"),
    ],
)
def test_anything_else_is_a_400_naming_it(kwargs, param):
    with pytest.raises(InvalidRequest) as e:
        checked_template_kwargs(kwargs, SWITCHES)
    assert e.value.param == param
