"""The split-point harness every tool-call family's golden tests use: a parser must give the
same pieces however its text is split, and the pieces must be those of the unsplit text."""

from __future__ import annotations

from typing import Any

from vllmmlxd.parsers.tools import ToolCall, ToolParser, tool_parser_class


def feed_all(
    family: str, tools: list[dict] | None, chunks: list[str], **options: Any
) -> tuple[ToolParser, list[tuple[str, Any]]]:
    """Feed ``chunks`` to a new parser (made with ``options``) and finish it: the parser and its
    pieces, neighbouring text pieces of one kind (content, reasoning) merged, empty ones dropped."""
    parser = tool_parser_class(family)(tools, **options)
    pieces: list[tuple[str, Any]] = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    pieces += parser.finish()
    merged: list[tuple[str, Any]] = []
    for kind, value in pieces:
        if kind != "tool_call" and merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        elif kind == "tool_call" or value:
            merged.append((kind, value))
    return parser, merged


def run(family: str, tools: list[dict] | None, chunks: list[str], **options: Any) -> list[tuple[str, object]]:
    """Feed ``chunks`` to a new parser; the pieces with neighbouring content merged."""
    return feed_all(family, tools, chunks, **options)[1]


def assert_splits_agree(
    family: str, tools: list[dict] | None, text: str, expected: list[tuple[str, object]], **options: Any
) -> None:
    """Whole, one character at a time, and at every two-piece split: always ``expected``."""
    assert run(family, tools, [text], **options) == expected
    assert run(family, tools, list(text), **options) == expected, "one character at a time"
    for i in range(1, len(text)):
        assert run(family, tools, [text[:i], text[i:]], **options) == expected, f"split at {i}: {text[:i]!r}"


def call(name: str, arguments: str) -> tuple[str, ToolCall]:
    return ("tool_call", ToolCall(name, arguments))
