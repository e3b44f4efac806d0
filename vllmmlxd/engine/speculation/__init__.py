"""Speculative decoding inside the continuous batch: prompt lookup or a draft model
(``speculative``), each row's draft width from measured step costs (``draft_width``), and a
rejected draft undone where the KV cannot be trimmed (``rollback``)."""

__all__ = ["draft_width", "rollback", "speculative"]
