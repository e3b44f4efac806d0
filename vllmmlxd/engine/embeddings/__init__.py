"""Embedding models (BERT-family and mlx-lm decoders), batched on the engine thread between
decode steps (``embedder``)."""

__all__ = ["bert", "embedder", "embedding_types"]
