"""How one tool-call family's cases are written down for the contract (test_tool_contract.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllmmlxd.parsers.tools import ToolParser, tool_parser_class

# The tools every family's cases offer (a family may add its own after them): the grammar checks
# of the contract lean on get_weather's schema (city required, days 1 to 7, nothing else).
TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]

Pieces = list[tuple[str, Any]]
# A text that is no call: given back as written (a str), or, where the format's framing is not
# part of the answer, (text, the pieces it gives).
NoCall = str | tuple[str, Pieces]
# A case as the contract reads it: (case name, text, expected pieces, tools offered).
Case = tuple[str, str, Pieces, list[dict] | None]


@dataclass(frozen=True)
class Family:
    """One family's cases: each group a dict of case name to case; every group but
    ``without_tools`` must hold at least one case."""

    name: str
    # Texts with calls, and the pieces they give with ``tools`` offered.
    calls: dict[str, tuple[str, Pieces]]
    # Answers with no call in them, marker-like characters and all.
    plain: dict[str, NoCall]
    # A call's text that does not parse (bad JSON, cut off, not the format's syntax).
    malformed: dict[str, NoCall]
    # A well-formed call of a function that was not offered.
    unknown_tool: dict[str, NoCall]
    # A call render_call writes (name, arguments), read back as that call.
    render: tuple[str, dict[str, Any]]
    # The special-token texts of the format (the parser's markers, exactly).
    markers: frozenset[str]
    # Two calls in the format: refused by the grammar of one call (accepted by the parallel one
    # where ``parallel``).
    two_calls: tuple[str, ...]
    # Exactly what render_call writes for ``render``, where the case pins it.
    rendered: str | None = None
    # Texts with calls read with no tools offered.
    without_tools: dict[str, tuple[str, Pieces]] = field(default_factory=dict)
    # More texts the grammar must accept, and must refuse, beyond the contract's own.
    grammar_accepts: tuple[str, ...] = ()
    grammar_refuses: tuple[str, ...] = ()
    # Whether the format has parallel calls at all.
    parallel: bool = True
    tools: list[dict] = field(default_factory=lambda: TOOLS)
    # Keyword arguments of the parser's constructor beyond the tools.
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def parser(self) -> type[ToolParser]:
        return tool_parser_class(self.name)

    def cases(self) -> list[Case]:
        """Every case of the family."""
        out: list[Case] = [(name, text, pieces, self.tools) for name, (text, pieces) in self.calls.items()]
        for group in (self.plain, self.malformed, self.unknown_tool):
            for name, case in group.items():
                text, pieces = (case, [("content", case)]) if isinstance(case, str) else case
                out.append((name, text, pieces, self.tools))
        out += [(name, text, pieces, None) for name, (text, pieces) in self.without_tools.items()]
        return out
