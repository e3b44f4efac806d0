"""Tokens and text: incremental detokenizing, stop strings, special tokens shown or hidden,
grammars for structured output (``constraint``), and what a chat template may be asked."""

__all__ = ["constraint", "detokenize", "special_text", "stops", "template_vars", "tool_setup"]
