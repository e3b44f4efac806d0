"""What crosses the engine boundary for reranking. No mlx here: the API layer imports it.

A ``Reranker`` is the model of a reranking entry. The API layer hands it a query and its
documents; it makes the model's pairs (tokenized, fitted to its limit), and scores them on
its own thread: one relevance score per pair, higher is more relevant.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

RerankKind = Literal["cross-encoder", "llm"]


@dataclass(frozen=True)
class Pair:
    """One query-document pair as the model reads it: token ids and, for a cross-encoder, each
    token's segment (0: the query's side, 1: the document's)."""

    ids: tuple[int, ...]
    types: tuple[int, ...] | None = None
    truncated: bool = False  # the document was cut to fit the model's limit

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class RerankerInfo:
    """What the API layer may know of the reranking model."""

    name: str  # what a request's ``model`` may say (besides the entry's names)
    source: str  # the spec or folder it was loaded from
    kind: RerankKind
    max_tokens: int  # one pair's tokens at most (query, document and the model's own tokens)
    score: str  # how a score is made of the model's output: "sigmoid", "identity" or "yes-no softmax"


@dataclass
class RerankStats:
    """Counters for /v1/status; written by the reranker's thread, read anywhere."""

    requests: int = 0  # requests scored (all their pairs)
    pairs: int = 0
    tokens: int = 0
    batches: int = 0  # forward passes
    errors: int = 0
    busy_s: float = 0.0  # time spent in forward passes
    waiting: int = 0  # requests queued or running now
    started: float = field(default_factory=time.time)

    def snapshot(self) -> dict:
        return {
            "requests": self.requests,
            "pairs": self.pairs,
            "tokens": self.tokens,
            "batches": self.batches,
            "errors": self.errors,
            "busy_s": round(self.busy_s, 3),
            "waiting": self.waiting,
        }


class Reranker(Protocol):
    info: RerankerInfo
    stats: RerankStats

    def make_pairs(self, query: str, documents: Sequence[str], *, truncate: bool) -> list[Pair]:
        """One pair per document, tokenized and within ``info.max_tokens``: the document's end is
        cut when ``truncate``, else ContextLengthExceeded; a query with no room left for a
        document is refused either way."""
        ...

    async def score(self, pairs: list[Pair]) -> np.ndarray:
        """One float32 relevance score per pair, in order; cancelling the awaiting task drops
        the batches not run yet."""
        ...

    def describe(self) -> dict:
        """The ``rerank`` block of /v1/status: the model and its counters."""
        ...

    def close(self) -> None: ...
