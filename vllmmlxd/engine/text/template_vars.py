"""Which switches a model's chat template reads, so a request may set those and nothing else.

A request's ``chat_template_kwargs`` reach the tokenizer's ``apply_chat_template``; passed
through unchecked, a client could send its own ``chat_template`` (a loop that never ends),
``padding="max_length", max_length=2**31`` and the like, and stall the worker. The names a
template reads are its undeclared variables; those that are rendering machinery or inputs the
server sets itself are never a request's to set. No mlx.
"""

from __future__ import annotations

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Set by the server or by transformers, or tokenizer arguments: never from a request.
RESERVED = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "raise_exception",
        "strftime_now",
        "range",
        "namespace",
        "dict",
        "loop",
        "custom_tools",
        "builtin_tools",
    }
)
FALLBACK = frozenset({"enable_thinking"})  # when the template cannot be read


def template_switches(chat_template: object) -> frozenset[str]:
    """The variables ``chat_template`` reads that a request may set (a dict of named templates:
    those of all of them)."""
    sources = chat_template.values() if isinstance(chat_template, dict) else [chat_template]
    names: set[str] = set()
    # Only parsed, never rendered here; still the sandbox, as everywhere a template is handled.
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    for source in sources:
        if not isinstance(source, str):
            continue
        try:
            names |= jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateError:
            return FALLBACK
    return frozenset(names - RESERVED) or FALLBACK
