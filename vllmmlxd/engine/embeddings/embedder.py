"""The embedding model of a worker: a BERT encoder fed padded batches by a thread of its own.

Requests queue for the ``mlx-embed`` thread, which tokenizes nothing (the API did) and runs
their inputs sorted by length, cut into batches bounded in rows and padded tokens: 64 short
inputs are two forward passes, and one long input does not pad 63 short ones.

Beside a generation engine, each batch runs on the engine thread, just before one of its
steps, while the engine generates (``EngineTurns``); only an idle engine leaves the batch to
the embedding thread. Measured on a 2-core CPU with MKL (bench/embeddings.py: SmolLM2-135M
decoding while 64-input requests arrive back to back), two threads running MLX at once
took the median inter-token gap from 40 ms to 135 ms and its p90 to 2.6 s (two BLAS thread
teams spinning on the same cores); batches between steps delay a step by one batch at most.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ...errors import ModelLoadError
from ...log import log_event
from ..loading import builtin
from ..task_engine import Job, JobThread, TaskEngine, task_model_info
from .bert import BertEncoder, is_bert_folder, is_sequence_classifier, load_bert
from .embedding_types import EmbedderInfo, EmbeddingStats

logger = logging.getLogger("vllmmlxd.engine")

MAX_BATCH_ROWS = 32  # inputs in one forward pass at most
MAX_BATCH_TOKENS = 4096  # rows x padded length of one forward pass at most (bounds its memory and time)
# Beside a generation engine a batch delays one of its steps: smaller batches, a shorter delay
# (2-core CPU: ~1,400 tokens/s, so 512 tokens hold a step back ~0.35 s; throughput barely changes).
SHARED_BATCH_TOKENS = 512


def plan_batches(
    lengths: Sequence[int], max_rows: int = MAX_BATCH_ROWS, max_tokens: int = MAX_BATCH_TOKENS
) -> list[list[int]]:
    """Input indices grouped into batches: sorted by length (little padding), each batch at
    most ``max_rows`` rows and ``max_tokens`` padded tokens (a longer input gets a batch alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending: the newest input is the longest, so it sets the batch's padded length.
        if current and (len(current) + 1 > max_rows or (len(current) + 1) * lengths[i] > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def is_embedding_spec(spec: str | None) -> bool:
    """True when a ``model:`` spec names an embedding model: an embedding builtin or a BERT folder."""
    if not spec:
        return False
    if spec.startswith("builtin:"):
        entry = builtin.BUILTINS.get(spec[len("builtin:") :])
        return entry is not None and entry.kind == "embedding"
    path = Path(spec).expanduser()
    # A BERT with a classification head is a cross-encoder: a reranker (engine/rerank), not an embedder.
    return path.is_dir() and is_bert_folder(path) and not is_sequence_classifier(path)


def max_tokens_of(folder: Path, position_limit: int) -> int:
    """The longest input: sentence-transformers' ``max_seq_length``, else the tokenizer's limit, within the positions."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and value > 0:
            return min(value, position_limit)
    return position_limit


def load_tokenizer(folder: Path) -> Any:
    """The folder's fast tokenizer, set to neither pad nor truncate: batches are padded here, by
    real lengths, and an over-long input must be seen (the bundled tokenizer.json pads to 128)."""
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    else:  # a folder with only vocab.txt: transformers builds the fast tokenizer from it
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer
    tok.no_padding()
    tok.no_truncation()
    return tok


class _Handoff:
    """One batch offered to the engine thread; whoever runs it sets ``done``."""

    def __init__(self, work: Callable[[], Any]):
        self.work = work
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.work()
        except Exception as exc:  # the embedding request fails, never the engine's step
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class EngineTurns:
    """Runs embedding batches on the engine thread, one before each step, while it generates.

    Two threads doing MLX work at once each drive the BLAS's thread team on the same cores
    (MKL's OpenMP teams spin while they wait): measured, that made a generation's tokens
    arrive seconds apart. So while the engine is busy, a batch waits for the engine thread's
    next step and runs just before it, which delays that step by one batch at most; while the
    engine is idle (it then sleeps on its queue and takes no steps), the embedding thread runs
    the batch itself.
    """

    POLL_S = 0.005  # how often a waiting batch checks whether the engine went idle

    def __init__(self, busy: Callable[[], bool]):
        self._busy = busy
        self._lock = threading.Lock()
        self._offered: _Handoff | None = None

    def take(self) -> None:
        """On the engine thread, before its step: run the batch on offer, if any."""
        with self._lock:
            handoff, self._offered = self._offered, None
        if handoff is not None:
            handoff.run()

    def run(self, work: Callable[[], Any]) -> Any:
        """``work()``'s result: run by the engine thread before its next step, or here when it is idle."""
        if not self._busy():
            return work()
        handoff = _Handoff(work)
        with self._lock:
            self._offered = handoff
        while not handoff.done.wait(self.POLL_S):
            with self._lock:
                take_back = self._offered is handoff and not self._busy()
                if take_back:
                    self._offered = None
            if take_back:  # the engine went idle before taking it
                return work()
        return handoff.result()


class MLXEmbedder:
    """Embeds token-id inputs with a BERT encoder on the ``mlx-embed`` thread."""

    def __init__(
        self,
        folder: Path,
        *,
        name: str,
        source: str,
        max_rows: int = MAX_BATCH_ROWS,
        max_tokens: int = MAX_BATCH_TOKENS,
        threaded: bool = True,
    ):
        self.folder = folder
        self.max_rows, self.batch_tokens = max_rows, max_tokens
        self.tokenizer = load_tokenizer(folder)
        self.stats = EmbeddingStats()
        self.model: BertEncoder = load_bert(folder)  # evaluated here: any thread may then read it
        cfg = self.model.config
        self.info = EmbedderInfo(
            name=name,
            source=source,
            dimensions=cfg.hidden_size,
            max_tokens=max_tokens_of(folder, cfg.max_position_embeddings),
            vocab_size=cfg.vocab_size,
            normalized=self.model.pooling.normalize,
        )
        self._turns: EngineTurns | None = None
        self.run_inputs([[0] * 8] * 2)  # the first pass allocates: done here, not in the first client's request
        self.stats = EmbeddingStats()  # the warm-up is no client's work
        self._jobs = JobThread("mlx-embed", self._handle) if threaded else None

    # -- the asyncio side ----------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    async def embed(self, inputs: list[list[int]]) -> np.ndarray:
        assert self._jobs is not None, "an embedder made with threaded=False runs on its caller's thread"
        self.stats.waiting += 1
        return await self._jobs.submit(inputs)

    def describe(self) -> dict:
        return {
            "model": self.info.name,
            "source": self.info.source,
            "dimensions": self.info.dimensions,
            "max_tokens": self.info.max_tokens,
            **self.stats.snapshot(),
        }

    def share_engine_thread(self, engine: Any) -> None:
        """Run this embedder's batches between ``engine``'s steps while it generates (see EngineTurns)."""
        stats = engine.stats
        self._turns = EngineTurns(lambda: stats.num_running + stats.num_waiting > 0)
        self.batch_tokens = min(self.batch_tokens, SHARED_BATCH_TOKENS)
        engine.before_each_step(self._turns.take)

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.close()

    # -- the thread ----------------------------------------------------------

    def _handle(self, job: Job[list[list[int]]]) -> Any:
        try:
            result: Any = self._run_job(job)
        except Exception as exc:  # a bad batch fails its request, never the thread
            self.stats.errors += 1
            log_event(logger, "embed.error", logging.ERROR, error=repr(exc))
            result = exc
        self.stats.waiting -= 1
        return result

    def _run_job(self, job: Job[list[list[int]]]) -> np.ndarray | None:
        if job.cancelled.is_set():
            return None
        out = self.run_inputs(job.payload, job.cancelled)
        if out is not None:
            self.stats.requests += 1
        return out

    def run_inputs(self, inputs: list[list[int]], cancelled: threading.Event | None = None) -> np.ndarray | None:
        """The vectors of ``inputs`` (in order), batch by batch; None when cancelled between batches."""
        out = np.empty((len(inputs), self.info.dimensions), dtype=np.float32)
        for rows in plan_batches([len(x) for x in inputs], self.max_rows, self.batch_tokens):
            if cancelled is not None and cancelled.is_set():
                return None
            batch = [inputs[i] for i in rows]
            out[rows] = (
                self._turns.run(functools.partial(self.run_batch, batch)) if self._turns else self.run_batch(batch)
            )
        return out

    def run_batch(self, batch: list[list[int]]) -> np.ndarray:
        """One forward pass over ``batch``, padded to its longest input."""
        started = time.perf_counter()
        width = max(len(x) for x in batch)
        ids = np.zeros((len(batch), width), dtype=np.int32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
        vectors = self.model(mx.array(ids), mx.array([len(x) for x in batch], dtype=mx.int32))
        result = np.array(vectors.astype(mx.float32))  # evaluates the graph, on this thread
        stats = self.stats
        stats.batches += 1
        stats.inputs += len(batch)
        stats.tokens += sum(len(x) for x in batch)
        stats.busy_s += time.perf_counter() - started
        return result


def load_embedder(spec: str, state_dir: Path) -> MLXEmbedder:
    """The embedder of ``spec``: an embedding builtin (fetched once) or a local BERT folder."""
    started = time.monotonic()
    if spec.startswith("builtin:"):
        name = spec[len("builtin:") :]
        entry = builtin.get_builtin(name)
        if entry.kind != "embedding":
            embedding = [n for n in builtin.builtin_names() if builtin.BUILTINS[n].kind == "embedding"]
            raise ModelLoadError(
                f"builtin:{name} is not an embedding model; embedding builtins are: "
                f"{', '.join('builtin:' + n for n in embedding)}"
            )
        folder = builtin.ensure_builtin(name, state_dir)
    else:
        folder = Path(spec).expanduser()
        if not folder.is_dir():
            raise ModelLoadError(
                f"embedding model not found: {folder}; expected builtin:NAME or a local folder "
                "of a BERT sentence-transformers model"
            )
        if not is_bert_folder(folder):
            raise ModelLoadError(
                f"{folder} is not a BERT model (config.json model_type 'bert'); "
                "only BERT-family embedding models are supported"
            )
        folder, name = folder.resolve(), folder.resolve().name
    try:
        embedder = MLXEmbedder(folder, name=name, source=spec)
    except ModelLoadError:
        raise
    except Exception as exc:  # missing or mismatched weights, a bad tokenizer or pooling file
        raise ModelLoadError(f"cannot load embedding model {spec!r}: {type(exc).__name__}: {exc}") from exc
    log_event(
        logger,
        "embed.load",
        spec=spec,
        path=str(folder),
        dimensions=embedder.info.dimensions,
        max_tokens=embedder.info.max_tokens,
        seconds=round(time.monotonic() - started, 2),
    )
    return embedder


EMBEDDINGS_ONLY = "this entry serves embeddings only (POST /v1/embeddings); its model cannot generate text"


class EmbeddingsOnlyEngine(TaskEngine):
    """The Engine of an entry whose model is an embedding model: generation routes answer 400,
    health, status and metrics read idle counters, and ``embedder`` does the work."""

    embeddings_only = True  # read by the API layer: the entry's names are the embedding model's

    refusal = EMBEDDINGS_ONLY

    def __init__(self, embedder: MLXEmbedder, *, name: str):
        self.embedder = embedder
        super().__init__(
            task_model_info(
                name,
                context_length=embedder.info.max_tokens,
                vocab_size=embedder.info.vocab_size,
                source=str(embedder.folder),
                template_switches=frozenset({"enable_thinking"}),
            )
        )
        self.max_queue = 0

    def close(self) -> None:
        self.embedder.close()
