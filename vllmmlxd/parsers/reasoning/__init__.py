"""Reasoning parsers, one module per family, found by name (``reasoning_parser: qwen3``)."""

from __future__ import annotations

import importlib

from vllmmlxd.parsers.reasoning.base import Kind, Piece, ReasoningParser

__all__ = ["REASONING_PARSERS", "Kind", "Piece", "ReasoningParser", "make_reasoning_parser"]

# Each name is a module here that defines ``Parser``; listed so that config can be
# checked without importing, and so that no other module name is ever imported.
REASONING_PARSERS: tuple[str, ...] = ("deepseek_r1", "qwen3")


def make_reasoning_parser(name: str, prompt_tail: str) -> ReasoningParser:
    """A new parser of family ``name`` for one request whose rendered prompt ends with ``prompt_tail``."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(REASONING_PARSERS)}")
    module = importlib.import_module(f"{__name__}.{name}")
    return module.Parser(prompt_tail)
