"""Tokens and text: incremental detokenizing, stop strings, special tokens shown or hidden,
grammars for structured output (``constraint``), what a chat template may be asked, and the
fill-in-the-middle prompt forms (``fim``)."""

__all__ = ["constraint", "detokenize", "fim", "special_text", "stops", "template_vars", "tool_setup"]
