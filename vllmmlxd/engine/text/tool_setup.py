"""What a loaded model needs for tools, settled once at load: its call format (``auto`` read
from the chat template) and whether its template renders ``tools`` at all. No mlx."""

from __future__ import annotations

from collections.abc import Callable

from ...parsers.tools.auto import family_for_template

FALLBACK_FAMILY = "hermes"  # the format most small chat models were tuned on

_PROBE_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "vllmmlxd_probe_tool",
            "description": "probe",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def resolve_tool_parser(configured: str, chat_template: str | None, vocab: set[str] | None) -> tuple[str, str]:
    """The tool-call family to use and how it was chosen: ``config``, ``template`` or ``fallback``."""
    if configured != "auto":
        return configured, "config"
    family = family_for_template(chat_template, vocab)
    return (family, "template") if family else (FALLBACK_FAMILY, "fallback")


def template_renders_tools(render: Callable[[list[dict], list[dict] | None], str]) -> bool:
    """Does the template put tool definitions in the prompt? (Rendered with and without one.)"""
    try:
        return render(_PROBE_MESSAGES, _PROBE_TOOLS) != render(_PROBE_MESSAGES, None)
    except Exception:  # a template that refuses tools does not render them either
        return False
