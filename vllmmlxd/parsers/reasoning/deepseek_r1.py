"""DeepSeek-R1 (and its distills): ``reasoning_parser: deepseek_r1``.

The template ends the prompt with ``<｜Assistant｜><think>\\n`` and the model writes
``reasoning...</think>answer`` with no start tag; some versions (R1-0528, older
templates that do not open the block) write ``<think>`` first, which is dropped.
A prompt that closed the block (``<think>\\n\\n</think>``, thinking disabled) makes
everything generated content. Otherwise generation starts in reasoning even when
the prompt shows no tag, since R1 always thinks first: if ``</think>`` never comes,
everything generated is reasoning and content is empty (nothing is lost).
"""

from __future__ import annotations

from vllmmlxd.parsers.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    """Reasoning from the first generated token up to ``</think>``."""

    starts_in_reasoning = True


Parser = DeepSeekR1ReasoningParser
