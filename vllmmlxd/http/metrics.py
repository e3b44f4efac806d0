"""Prometheus metrics of one worker: HTTP requests, engine counters, the process.

Each app has its own registry (never prometheus_client's global one), so two apps in
one process, as in tests, do not clash. Every metric carries the served ``model`` name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine.embeddings.embedding_types import Embedder
from ..engine.types import Engine

# Generations run for minutes; the default buckets stop at 10 s.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))

# (metric name, help, EngineStats field); counters end in _total, gauges do not.
_COUNTERS = (
    ("vllmmlxd_prompt_tokens_total", "Prompt tokens processed.", "total_prompt_tokens"),
    ("vllmmlxd_completion_tokens_total", "Completion tokens generated.", "total_completion_tokens"),
    ("vllmmlxd_requests_processed_total", "Generations the engine finished.", "total_requests_processed"),
    ("vllmmlxd_engine_steps_total", "Engine steps executed.", "steps_executed"),
)
_GAUGES = (
    ("vllmmlxd_requests_running", "Generations running in the engine.", "num_running"),
    ("vllmmlxd_requests_waiting", "Generations waiting for the engine.", "num_waiting"),
)
_EMBEDDING_COUNTERS = (
    ("vllmmlxd_embedding_requests_total", "Embedding requests answered.", "requests"),
    ("vllmmlxd_embedding_inputs_total", "Inputs embedded.", "inputs"),
    ("vllmmlxd_embedding_tokens_total", "Tokens run through the embedding model.", "tokens"),
    ("vllmmlxd_embedding_batches_total", "Forward passes of the embedding model.", "batches"),
)
_RERANK_COUNTERS = (
    ("vllmmlxd_rerank_requests_total", "Rerank and score requests answered.", "requests"),
    ("vllmmlxd_rerank_pairs_total", "Query-document pairs scored.", "pairs"),
    ("vllmmlxd_rerank_tokens_total", "Tokens run through the reranking model.", "tokens"),
    ("vllmmlxd_rerank_batches_total", "Forward passes of the reranking model.", "batches"),
)
_SPEECH_COUNTERS = (
    ("vllmmlxd_speech_requests_total", "Transcriptions and translations answered.", "requests"),
    ("vllmmlxd_speech_errors_total", "Transcriptions the speech model failed.", "errors"),
    ("vllmmlxd_speech_audio_seconds_total", "Seconds of audio transcribed.", "audio_s"),
    ("vllmmlxd_speech_busy_seconds_total", "Seconds the speech model spent transcribing.", "busy_s"),
)
_CACHE_COUNTERS = (
    ("vllmmlxd_prefix_cache_hits_total", "Prompts that took a start from the prefix cache.", "hits"),
    ("vllmmlxd_prefix_cache_misses_total", "Prompts that found nothing in the prefix cache.", "misses"),
    ("vllmmlxd_prefix_cache_cached_tokens_total", "Prompt tokens taken from the prefix cache.", "cached_tokens"),
    ("vllmmlxd_prefix_cache_evictions_total", "Blocks (or whole entries) evicted to keep the budget.", "evictions"),
)
_DISK_COUNTERS = (
    ("vllmmlxd_prefix_cache_disk_hits_total", "Prompts that took blocks from the disk tier.", "hits"),
    ("vllmmlxd_prefix_cache_disk_blocks_read_total", "Blocks read back from the disk tier.", "blocks_read"),
    ("vllmmlxd_prefix_cache_disk_blocks_written_total", "Blocks written to the disk tier.", "blocks_written"),
    ("vllmmlxd_prefix_cache_disk_rejected_total", "Block files refused when read (damaged or foreign).", "rejected"),
)


class EngineCollector:
    """Reads the engine's stats, prefix cache and memory at scrape time, so the engine thread
    never touches prometheus_client."""

    def __init__(self, engine: Engine, model: str, embedder: Embedder | None = None):
        self._engine = engine
        self._model = model
        self._embedder = embedder

    def _family(self, kind: type[CounterMetricFamily | GaugeMetricFamily], name: str, doc: str, value: float) -> Metric:
        family = kind(name, doc, labels=["model"])
        family.add_metric([self._model], value)
        return family

    def collect(self) -> Iterator[Metric]:
        """Counters, gauges and the latency histograms, each labelled with the model."""
        stats = self._engine.stats
        for name, doc, field in _COUNTERS:
            yield self._family(CounterMetricFamily, name, doc, getattr(stats, field))
        for name, doc, field in _GAUGES:
            yield self._family(GaugeMetricFamily, name, doc, getattr(stats, field))
        for name, doc, hist in (
            ("vllmmlxd_time_to_first_token_seconds", "From arrival to the first generated token.", stats.ttft),
            ("vllmmlxd_inter_token_latency_seconds", "Between two tokens of one generation.", stats.inter_token),
        ):
            family = HistogramMetricFamily(name, doc, labels=["model"])
            buckets = [(str(b), c) for b, c in zip(hist.bounds, hist.counts)] + [("+Inf", hist.count)]
            family.add_metric([self._model], buckets, hist.total)
            yield family
        if self._embedder is not None:  # only entries with an embedding model have these
            for name, doc, field in _EMBEDDING_COUNTERS:
                yield self._family(CounterMetricFamily, name, doc, getattr(self._embedder.stats, field))
        reranker = getattr(self._engine, "reranker", None)
        if reranker is not None:  # only reranking entries have these
            for name, doc, field in _RERANK_COUNTERS:
                yield self._family(CounterMetricFamily, name, doc, getattr(reranker.stats, field))
        transcriber = getattr(self._engine, "transcriber", None)
        if transcriber is not None:  # only speech entries have these
            for name, doc, field in _SPEECH_COUNTERS:
                yield self._family(CounterMetricFamily, name, doc, getattr(transcriber.stats, field))
            yield self._family(
                GaugeMetricFamily,
                "vllmmlxd_speech_waiting",
                "Uploads waiting for the speech model.",
                transcriber.stats.waiting,
            )
        cache = self._engine.cache_status()
        for name, doc, key in _CACHE_COUNTERS:
            yield self._family(CounterMetricFamily, name, doc, cache[key])
        yield self._family(
            GaugeMetricFamily,
            "vllmmlxd_prefix_cache_bytes",
            "Bytes of KV held by the prefix cache.",
            cache["memory_mb"] * 1024**2,
        )
        yield self._family(
            GaugeMetricFamily,
            "vllmmlxd_prefix_cache_budget_bytes",
            "The prefix cache's byte budget.",
            cache["budget_mb"] * 1024**2,
        )
        yield self._family(
            GaugeMetricFamily,
            "vllmmlxd_prefix_cache_entries",
            "Blocks (or whole sequences) in the prefix cache.",
            cache["entries"],
        )
        disk = cache.get("disk")
        if disk and "used_mb" in disk:  # only entries with a disk tier have these
            for name, doc, key in _DISK_COUNTERS:
                yield self._family(CounterMetricFamily, name, doc, disk[key])
            yield self._family(
                GaugeMetricFamily,
                "vllmmlxd_prefix_cache_disk_bytes",
                "Bytes of block files in the disk tier.",
                disk["used_mb"] * 1024**2,
            )
            yield self._family(
                GaugeMetricFamily,
                "vllmmlxd_prefix_cache_disk_budget_bytes",
                "The disk tier's byte budget.",
                disk["budget_mb"] * 1024**2,
            )
        yield from self._kv()
        yield from self._speculation()
        yield from self._distributed()
        for key, value in self._engine.memory().items():  # active / peak / cache memory of MLX, in GB
            name = "vllmmlxd_mlx_" + key.removesuffix("_gb") + "_bytes"
            yield self._family(
                GaugeMetricFamily, name, f"MLX {key.removesuffix('_gb').replace('_', ' ')}.", value * 1024**3
            )

    def _kv(self) -> Iterator[Metric]:
        """The KV budget of running requests: the budget, what the running reserve and hold, who waits."""
        status = getattr(self._engine, "kv_status", None)
        kv = status() if status is not None else None
        if not kv:
            return
        mib = 1024**2
        for name, doc, key, scale in (
            ("vllmmlxd_kv_budget_bytes", "The KV budget of running requests.", "budget_mb", mib),
            ("vllmmlxd_kv_reserved_bytes", "KV bytes the running requests reserve.", "reserved_mb", mib),
            ("vllmmlxd_kv_held_bytes", "KV bytes the batch holds.", "held_mb", mib),
            ("vllmmlxd_requests_waiting_for_kv", "Generations waiting for room in the KV budget.", "waiting", 1),
        ):
            if kv.get(key) is not None:
                yield self._family(GaugeMetricFamily, name, doc, kv[key] * scale)

    def _speculation(self) -> Iterator[Metric]:
        """Draft tokens verified and accepted, for an entry that speculates (not one whose model cannot)."""
        status = getattr(self._engine, "speculation_status", None)
        spec = status() if status is not None else None
        if not spec or spec.get("off"):
            return
        for name, doc, key in (
            ("vllmmlxd_speculative_drafted_tokens", "Draft tokens verified.", "drafted_tokens"),
            ("vllmmlxd_speculative_accepted_tokens", "Draft tokens the model accepted.", "accepted_tokens"),
            ("vllmmlxd_speculative_verify_steps", "Forward passes that verified drafts.", "verify_steps"),
        ):
            yield self._family(CounterMetricFamily, name, doc, spec[key])

    def _distributed(self) -> Iterator[Metric]:
        """A distributed entry's ranks and each one's last step (and, for the others, frame wait)."""
        status = getattr(self._engine, "distributed_status", None)
        dist = status() if status is not None else None
        if not dist:
            return
        yield self._family(
            GaugeMetricFamily, "vllmmlxd_distributed_ranks", "Ranks the model is split over.", dist["world"]
        )
        yield self._family(
            CounterMetricFamily, "vllmmlxd_distributed_frames", "Frames rank 0 sent the other ranks.", dist["frames"]
        )
        for name, doc, key in (
            ("vllmmlxd_rank_step_seconds", "Each rank's last batch step.", "step_ms"),
            ("vllmmlxd_rank_frame_wait_seconds", "Each other rank's last wait for rank 0's frame.", "wait_ms"),
        ):
            family = GaugeMetricFamily(name, doc, labels=["model", "rank"])
            for rank in dist["ranks"]:
                if rank.get(key) is not None:
                    family.add_metric([self._model, str(rank["rank"])], rank[key] / 1000)
            yield family

    def describe(self) -> Iterator[Metric]:
        """The same families, so the registry can refuse duplicate names."""
        return self.collect()


class Metrics:
    """One app's registry with its HTTP instruments and the engine's collector."""

    def __init__(self, engine: Engine, model: str, embedder: Embedder | None = None):
        self.model = model
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "vllmmlxd_requests_total",
            "HTTP requests answered, by route template and status.",
            ["model", "route", "status"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "vllmmlxd_request_duration_seconds",
            "Time from request to the last body byte, by route template.",
            ["model", "route"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineCollector(engine, model, embedder))
        # Cheap: /proc reads on Linux (nothing on macOS), gc and platform info.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request and its duration."""
        self._requests.labels(self.model, route, str(status)).inc()
        self._duration.labels(self.model, route).observe(seconds)

    def response(self) -> Response:
        """The registry in Prometheus' text format."""
        return Response(generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


class MetricsMiddleware:
    """Pure ASGI: times each HTTP request until its body is sent, streams included.

    The route label is the matched route's template (``/v1/models/{model_id:path}``),
    else ``other``, so raw paths never become labels.
    """

    def __init__(self, app: ASGIApp, *, metrics: Metrics, enabled: Callable[[], bool] = lambda: True):
        self.app = app
        self.metrics = metrics
        self.enabled = enabled  # read per request: metrics can be switched on and off live

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled():
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response starts becomes a 500 outside us

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            # The router writes the matched route into this same scope dict.
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", None) or "other"
            self.metrics.observe(route, status, time.perf_counter() - started)
