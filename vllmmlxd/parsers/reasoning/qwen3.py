"""Qwen3 (and QwQ, Qwen3-2507): ``reasoning_parser: qwen3``.

What the templates leave at the end of the prompt, and what the model then writes:

- thinking on, older templates: ``<|im_start|>assistant\\n``; the model writes
  ``<think>\\n...\\n</think>\\n\\nanswer`` itself;
- thinking on, newer templates (Qwen3-2507 Thinking, QwQ): ``...assistant\\n<think>\\n``;
  the model writes ``...\\n</think>\\n\\nanswer``;
- ``enable_thinking: false``: ``...assistant\\n<think>\\n\\n</think>\\n\\n``; everything
  generated is content.

With no block opened by the prompt, output that does not start with ``<think>``
(after optional whitespace) is all content: Qwen3 answering without thinking.
A ``<think>`` that never closes leaves everything after it as reasoning.
"""

from __future__ import annotations

from vllmmlxd.parsers.reasoning.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    """``<think>`` blocks that the prompt or the model's first words open."""

    starts_in_reasoning = False


Parser = Qwen3ReasoningParser
