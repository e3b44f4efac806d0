"""Speculative decoding inside the continuous batch: prompt lookup or a draft model
(``speculative``) or a checkpoint's multi-token-prediction layers (``mtp``), each row's draft
width from measured step costs (``draft_width``), and a rejected draft undone where the KV
cannot be trimmed (``rollback``)."""

__all__ = ["draft_width", "mtp", "rollback", "speculative"]
