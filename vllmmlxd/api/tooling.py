"""Tools in a request, in no family's words: what the engine parses out of the answer, and the
grammar that forces a call when the request demands one. Pure.

- ``auto``: the model is free; its calls are read out of its text (``enable_auto_tool_choice``,
  on by default; off, the text stays text).
- ``required`` (OpenAI) / ``any`` (Anthropic), or one named tool: decoding is held to the
  model's own call format with each tool's JSON schema inside, so even a small model writes a
  well-formed call that the same parser reads back.
- ``none``: the tools stay in the prompt (so token counts agree with the other modes), and
  nothing is read as a call.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from ..engine.types import Constraint, ToolUse
from ..errors import InvalidRequest
from ..parsers.tools import tool_parser_class
from ..parsers.tools.base import function_of, tool_names

Mode = Literal["auto", "none", "required", "named"]
# OpenAI's tool_choice strings, each as its Mode (a lookup gives mypy the Literal; `in` a tuple does not).
_OPENAI_MODES: dict[str, Mode] = {"auto": "auto", "none": "none", "required": "required"}


@dataclass(frozen=True)
class ToolChoice:
    mode: Mode = "auto"
    name: str | None = None  # the tool, when mode is named
    parallel: bool = True  # more than one call allowed
    param: str = "tool_choice"  # where the request said so, for errors


@dataclass(frozen=True)
class ToolPlan:
    use: ToolUse | None = None
    constraint: Constraint | None = None


def plan_tools(
    tools: list[dict] | None, choice: ToolChoice, *, parser: str | None, auto_enabled: bool, after_reasoning: bool
) -> ToolPlan:
    """How to serve ``tools`` under ``choice`` with the model's tool-call ``parser`` family."""
    if not tools:
        if choice.mode in ("required", "named"):
            raise InvalidRequest(f"tool_choice {choice.mode!r} needs tools", param=choice.param)
        return ToolPlan()
    for i, tool in enumerate(tools):
        if not function_of(tool).get("name"):
            raise InvalidRequest(f"tools[{i}] has no function name", param=f"tools[{i}]")
    if choice.mode == "none" or parser is None:
        return ToolPlan(ToolUse(tuple(tools), parse_calls=False))
    if choice.mode == "auto":
        return ToolPlan(ToolUse(tuple(tools), parse_calls=auto_enabled))
    chosen = tools
    if choice.mode == "named":
        if choice.name not in tool_names(tools):
            raise InvalidRequest(f"tool_choice names {choice.name!r}, which is not among the tools", param=choice.param)
        chosen = [t for t in tools if function_of(t).get("name") == choice.name]
    grammar = tool_parser_class(parser).grammar(chosen, parallel=choice.parallel and choice.mode == "required")
    return ToolPlan(ToolUse(tuple(tools)), Constraint(grammar, after_reasoning=after_reasoning))


def openai_tool_choice(value: str | dict[str, Any] | None, parallel: bool | None) -> ToolChoice:
    """OpenAI's ``tool_choice``: "auto" | "none" | "required" | {"type": "function", "function": {"name"}}.

    A forced turn holds one call unless the client asks for several in so many words
    (``parallel_tool_calls: true``): held to the call format, a small model that would rather
    go on writes call after call until ``max_tokens`` (seen with SmolLM2 at temperature 0).
    """
    par = parallel is True
    if value is None:
        return ToolChoice("auto", parallel=par)
    if isinstance(value, str) and value in _OPENAI_MODES:
        return ToolChoice(_OPENAI_MODES[value], parallel=par)
    if isinstance(value, dict):
        name = (value.get("function") or {}).get("name") or value.get("name")
        if value.get("type") in ("function", None) and isinstance(name, str):
            return ToolChoice("named", name, parallel=False)
    raise InvalidRequest(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def anthropic_tool_choice(kind: str | None, name: str | None, disable_parallel: bool | None) -> ToolChoice:
    """Anthropic's ``tool_choice``: auto | any | tool (with name) | none. A forced turn holds one
    call unless ``disable_parallel_tool_use`` is sent as false (see ``openai_tool_choice``)."""
    par = disable_parallel is False
    if kind is None or kind == "auto":
        return ToolChoice("auto", parallel=par)
    if kind == "none":
        return ToolChoice("none", parallel=par)
    if kind == "any":
        return ToolChoice("required", parallel=par)
    if not name:
        raise InvalidRequest('tool_choice {"type": "tool"} needs a name', param="tool_choice.name")
    return ToolChoice("named", name, parallel=False)


def call_id(prefix: str, request_id: str, index: int) -> str:
    """A tool call's id, the same in a stream and in the whole response of one request."""
    return prefix + hashlib.sha256(f"{request_id}:{index}".encode()).hexdigest()[:24]


def cut_call(text: str, tools: list[dict], choice: ToolChoice) -> tuple[str, str] | None:
    """A forced call that ``max_tokens`` cut short, read out of its text in any family's format:
    the tool's name and the arguments as far as they were written (from the first ``{`` after
    the name; empty before it), or None when no tool can be named.

    The tool is the named one, the only one, or the one whose name the text shows first. Every
    family writes the name before the arguments, so what follows the name is the arguments."""
    if not text.strip():
        return None
    names = [choice.name] if choice.mode == "named" and choice.name else sorted(tool_names(tools))
    found = [(text.find(n), -len(n), n) for n in names if n in text]
    if found:
        at, _, name = min(found)
        rest = text[at + len(name) :]
    elif len(names) == 1:  # the name itself was cut
        name, rest = names[0], ""
    else:
        return None
    brace = rest.find("{")
    return name, (rest[brace:].rstrip() if brace >= 0 else "")
