"""Tool-call parsers, one module per family, found by name (``tool_call_parser: hermes``)."""

from __future__ import annotations

import importlib

from vllmmlxd.parsers.tools.base import Piece, ToolCall, ToolParser

__all__ = ["TOOL_PARSERS", "Piece", "ToolCall", "ToolParser", "tool_parser_class"]

# Each name is a module here that defines ``Parser``; listed so that config can be checked
# without importing, and so that no other module name is ever imported.
TOOL_PARSERS: tuple[str, ...] = (
    "auto",
    "deepseek",
    "functionary",
    "glm47",
    "granite",
    "harmony",
    "hermes",
    "kimi",
    "llama",
    "mistral",
    "nemotron",
    "qwen",
    "xlam",
)


def tool_parser_class(name: str) -> type[ToolParser]:
    """The parser class of family ``name``."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool call parser {name!r}; known: {', '.join(TOOL_PARSERS)}")
    return importlib.import_module(f"{__name__}.{name}").Parser
