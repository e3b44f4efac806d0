"""Speculative decoding inside the continuous batch: prompt lookup or a draft model
(``speculative``), each row's draft width from measured step costs (``draft_width``)."""

__all__ = ["draft_width", "speculative"]
