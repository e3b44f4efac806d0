"""The reranking model of a worker: a scorer (a BERT cross-encoder or an LLM reranker) fed
padded batches of query-document pairs by a thread of its own (``mlx-rerank``).

As for embeddings (engine/embeddings/embedder.py), a request's pairs run sorted by length and
cut into batches bounded in rows and padded tokens, so 100 short documents are a few forward
passes and one long document does not pad the others. A reranking entry holds no generation
engine: its ``RerankOnlyEngine`` answers generation routes with a 400 and idles for health,
status and metrics.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...errors import ModelLoadError
from ...log import log_event
from ..embeddings.bert import is_sequence_classifier
from ..embeddings.embedder import plan_batches
from ..loading import builtin
from ..task_engine import Job, JobThread, TaskEngine, task_model_info
from .rerank_types import Pair, RerankerInfo, RerankStats

logger = logging.getLogger("vllmmlxd.engine")

RERANK_ONLY = "this entry serves reranking only (POST /v1/rerank, /v1/score); its model cannot generate text"


class Scorer(Protocol):
    kind: Any
    activation: str
    limit: int
    max_rows: int
    max_tokens: int

    def make_pairs(self, query: str, documents: Sequence[str], *, truncate: bool) -> list[Pair]: ...

    def run_batch(self, pairs: list[Pair]) -> np.ndarray: ...


def is_rerank_spec(spec: str | None, task: str | None = None) -> bool:
    """True when an entry serves a reranker: ``task: rerank``, a reranking builtin, or a BERT
    folder with a sequence-classification head (found by its config.json)."""
    if not spec:
        return False
    if task == "rerank":
        return True
    if spec.startswith("builtin:"):
        entry = builtin.BUILTINS.get(spec[len("builtin:") :])
        return entry is not None and entry.kind == "rerank"
    path = Path(spec).expanduser()
    return path.is_dir() and is_sequence_classifier(path)


class MLXReranker:
    """Scores pairs with ``scorer`` on the ``mlx-rerank`` thread."""

    def __init__(self, scorer: Scorer, *, name: str, source: str, threaded: bool = True):
        self.scorer = scorer
        self.info = RerankerInfo(
            name=name, source=source, kind=scorer.kind, max_tokens=scorer.limit, score=scorer.activation
        )
        self.stats = RerankStats()
        self.run_pairs(scorer.make_pairs("warm", ["up", "up"], truncate=True))  # the first pass allocates
        self.stats = RerankStats()  # the warm-up is no client's work
        self._jobs = JobThread("mlx-rerank", self._handle) if threaded else None

    # -- the asyncio side ----------------------------------------------------

    def make_pairs(self, query: str, documents: Sequence[str], *, truncate: bool) -> list[Pair]:
        return self.scorer.make_pairs(query, documents, truncate=truncate)

    async def score(self, pairs: list[Pair]) -> np.ndarray:
        assert self._jobs is not None, "a reranker made with threaded=False runs on its caller's thread"
        self.stats.waiting += 1
        return await self._jobs.submit(pairs)

    def describe(self) -> dict:
        return {
            "model": self.info.name,
            "source": self.info.source,
            "kind": self.info.kind,
            "score": self.info.score,
            "max_tokens": self.info.max_tokens,
            **self.stats.snapshot(),
        }

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.close()

    # -- the thread ----------------------------------------------------------

    def _handle(self, job: Job[list[Pair]]) -> Any:
        try:
            result: Any = None if job.cancelled.is_set() else self.run_pairs(job.payload, job.cancelled)
            if result is not None:
                self.stats.requests += 1
        except Exception as exc:  # a bad batch fails its request, never the thread
            self.stats.errors += 1
            log_event(logger, "rerank.error", logging.ERROR, error=repr(exc))
            result = exc
        self.stats.waiting -= 1
        return result

    def run_pairs(self, pairs: list[Pair], cancelled: threading.Event | None = None) -> np.ndarray | None:
        """The scores of ``pairs`` (in order), batch by batch; None when cancelled between batches."""
        out = np.empty(len(pairs), dtype=np.float32)
        scorer = self.scorer
        for rows in plan_batches([len(p) for p in pairs], scorer.max_rows, scorer.max_tokens):
            if cancelled is not None and cancelled.is_set():
                return None
            started = time.perf_counter()
            batch = [pairs[i] for i in rows]
            out[rows] = scorer.run_batch(batch)
            stats = self.stats
            stats.batches += 1
            stats.pairs += len(batch)
            stats.tokens += sum(len(p) for p in batch)
            stats.busy_s += time.perf_counter() - started
        return out


def _model_type(folder: Path | str) -> str | None:
    try:
        return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def make_scorer(spec: str, state_dir: Path, *, trust_remote_code: bool = False) -> tuple[Scorer, str, Path | str]:
    """The scorer of ``spec`` with the name it is served under and where it was loaded from: a
    cross-encoder folder or builtin, else (``task: rerank``) a causal LM loaded by mlx-lm."""
    from .cross_encoder import CrossEncoderScorer

    if spec.startswith("builtin:"):
        name = spec[len("builtin:") :]
        entry = builtin.get_builtin(name)
        if entry.kind == "rerank":
            folder = builtin.ensure_builtin(name, state_dir)
            return CrossEncoderScorer(folder), name, folder
    else:
        folder = Path(spec).expanduser()
        if folder.is_dir() and is_sequence_classifier(folder):
            folder = folder.resolve()
            return CrossEncoderScorer(folder), folder.name, folder
    from ..loading.loader import load_model
    from .llm_reranker import LLMScorer

    loaded = load_model(spec, state_dir, trust_remote_code=trust_remote_code)
    return LLMScorer(loaded, _model_type(loaded.path)), loaded.name, loaded.path


def load_reranker(spec: str, state_dir: Path, *, trust_remote_code: bool = False) -> MLXReranker:
    """The reranker of ``spec``, its thread started."""
    started = time.monotonic()
    try:
        scorer, name, path = make_scorer(spec, state_dir, trust_remote_code=trust_remote_code)
        reranker = MLXReranker(scorer, name=name, source=spec)
    except ModelLoadError:
        raise
    except Exception as exc:  # missing or mismatched weights, a bad tokenizer, no yes/no tokens
        raise ModelLoadError(f"cannot load reranking model {spec!r}: {type(exc).__name__}: {exc}") from exc
    log_event(
        logger,
        "rerank.load",
        spec=spec,
        path=str(path),
        kind=reranker.info.kind,
        max_tokens=reranker.info.max_tokens,
        seconds=round(time.monotonic() - started, 2),
    )
    return reranker


class RerankOnlyEngine(TaskEngine):
    """The Engine of a reranking entry: generation routes answer 400, health, status and metrics
    read idle counters, and ``reranker`` does the work."""

    rerank_only = True  # read by the API layer: the entry's names are the reranker's

    refusal = RERANK_ONLY

    def __init__(self, reranker: MLXReranker, *, name: str):
        self.reranker = reranker
        info = task_model_info(name, context_length=reranker.info.max_tokens, vocab_size=0, source=reranker.info.source)
        super().__init__(info)
        self.max_queue = 0

    def close(self) -> None:
        self.reranker.close()
