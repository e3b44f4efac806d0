"""Rerankers: BERT cross-encoders and LLM rerankers of the Qwen3-Reranker kind, scoring
query-document pairs on a thread of their own (``reranker``) for ``/v1/rerank`` and ``/v1/score``."""

__all__ = ["cross_encoder", "llm_reranker", "pairs", "rerank_types", "reranker"]
