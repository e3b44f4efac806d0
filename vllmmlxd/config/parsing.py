"""How a model's text is read and written: its reasoning apart from its answer, its tool calls,
and its fill-in-the-middle prompt form."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import Strict
from .fields import one_of
from .names import REASONING_PARSERS, TOOL_PARSERS

ReasoningParser = Annotated[str, one_of(REASONING_PARSERS)]
ToolCallParser = Annotated[str, one_of(TOOL_PARSERS)]


class ParsingConfig(Strict):
    """``reasoning_parser``, ``tool_call_parser``, ``enable_auto_tool_choice``, ``fim``."""

    reasoning_parser: ReasoningParser | None = Field(
        None, description="qwen3 or deepseek_r1: return reasoning apart from the answer"
    )
    tool_call_parser: ToolCallParser = Field(
        "auto", description="the model's tool-call format: auto (from its chat template, else hermes) or a family"
    )
    enable_auto_tool_choice: bool = Field(
        True, description="read the model's own tool calls (tool_choice auto); false: only forced calls"
    )
    fim: Literal["auto", "qwen", "starcoder", "deepseek", "codestral", "off"] = Field(
        "auto",
        description="/v1/completions' suffix (fill-in-the-middle): auto reads the form from the tokenizer's "
        "control tokens; a form names it; off refuses suffix",
    )
