"""The split-point harness every tool-call family's golden tests use: a parser must give the
same pieces however its text is split, and the pieces must be those of the unsplit text."""

from __future__ import annotations

from vllmmlxd.parsers.tools import ToolCall, tool_parser_class


def run(family: str, tools: list[dict] | None, chunks: list[str]) -> list[tuple[str, object]]:
    """Feed ``chunks`` to a new parser; the pieces with neighbouring content merged."""
    parser = tool_parser_class(family)(tools)
    pieces = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    pieces += parser.finish()
    merged: list[tuple[str, object]] = []
    for kind, value in pieces:
        if kind == "content" and merged and merged[-1][0] == "content":
            merged[-1] = ("content", merged[-1][1] + value)
        elif kind != "content" or value:
            merged.append((kind, value))
    return merged


def assert_splits_agree(family: str, tools: list[dict] | None, text: str, expected: list[tuple[str, object]]) -> None:
    """Whole, one character at a time, and at every two-piece split: always ``expected``."""
    assert run(family, tools, [text]) == expected
    assert run(family, tools, list(text)) == expected, "one character at a time"
    for i in range(1, len(text)):
        assert run(family, tools, [text[:i], text[i:]]) == expected, f"split at {i}: {text[:i]!r}"


def call(name: str, arguments: str) -> tuple[str, ToolCall]:
    return ("tool_call", ToolCall(name, arguments))
