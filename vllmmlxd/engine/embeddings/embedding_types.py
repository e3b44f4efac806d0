"""What crosses the engine boundary for embeddings. No mlx here: the API layer imports it.

An ``Embedder`` is a second model a worker may hold beside its generation engine (or
instead of one: an embeddings-only entry). It owns its own MLX arrays; the API layer
tokenizes through it, checks lengths, and awaits ``embed``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class EmbedderInfo:
    """What the API layer may know of the embedding model."""

    name: str  # what a request's ``model`` may say (besides the entry's names)
    source: str  # the spec or folder it was loaded from
    dimensions: int
    max_tokens: int  # longer inputs are refused (or truncated when the request asks)
    vocab_size: int
    normalized: bool  # unit vectors (the model's pooling ends with a Normalize module)


@dataclass
class EmbeddingStats:
    """Counters for /v1/status and /metrics; written by the embedder's thread, read anywhere."""

    requests: int = 0  # requests embedded (all their inputs)
    inputs: int = 0
    tokens: int = 0
    batches: int = 0  # forward passes
    errors: int = 0
    busy_s: float = 0.0  # time spent in forward passes
    waiting: int = 0  # requests queued or running now
    started: float = field(default_factory=time.time)

    def snapshot(self) -> dict:
        return {
            "requests": self.requests,
            "inputs": self.inputs,
            "tokens": self.tokens,
            "batches": self.batches,
            "errors": self.errors,
            "busy_s": round(self.busy_s, 3),
            "waiting": self.waiting,
        }


class Embedder(Protocol):
    info: EmbedderInfo
    stats: EmbeddingStats

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, with the model's special tokens, never padded nor truncated."""
        ...

    async def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """One float32 vector per input, in order (shape ``(len(inputs), dimensions)``);
        cancelling the awaiting task drops the batches not run yet."""
        ...

    def describe(self) -> dict:
        """The ``embedding`` block of /v1/status: the model and its counters."""
        ...

    def close(self) -> None: ...
