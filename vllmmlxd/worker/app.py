"""The worker's HTTP apps over one engine: the public one (API families, health, status,
metrics) and the private one the daemon reaches over its Unix socket (health with load and
config hash, settings pushes).

Two apps, not one with a guard: a route that exists only on the private app cannot be
reached from the public port whatever a request claims to be.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import Depends, FastAPI, params
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import __version__
from ..api.anthropic.routes import make_router as make_anthropic_router
from ..api.context import LiveContext, owner_of, shown_source
from ..api.errors import install_error_handlers
from ..api.mcp_routes import make_router as make_mcp_router
from ..api.ollama.routes import make_router as make_ollama_router
from ..api.openai.audio import make_router as make_audio_router
from ..api.openai.embeddings import make_router as make_embeddings_router
from ..api.openai.routes import make_router as make_openai_router
from ..api.openapi import install as install_openapi
from ..api.rerank import make_router as make_rerank_router
from ..api.responses.routes import make_router as make_responses_router
from ..api.tokenizer_routes import make_router as make_tokenizer_router
from ..config.schema import ResolvedModel
from ..engine.embeddings.embedding_types import Embedder
from ..engine.types import Engine
from ..errors import Unauthorized
from ..http.access import Caller
from ..http.access_log import AccessLogMiddleware
from ..http.activity import Activity, ActivityMiddleware
from ..http.browser import BrowserDefences
from ..http.key_usage import KeyUsageCollector, check_budget, recorder
from ..http.metrics import Metrics, MetricsMiddleware
from ..http.ratelimit import STATE_KEY, RateLimitHeaders
from ..http.request_id import RequestIdMiddleware
from ..http.tracing import TRACING, TraceCollector, TracingMiddleware
from ..log import log_event
from ..mcp.hub import McpHub
from ..usage import Ledger
from ..version import commit
from .liveness import DEGRADED, engine_health, stuck_after_s
from .settings import SettingsRefused, judge_update

logger = logging.getLogger("vllmmlxd.worker")


def create_app(
    engine: Engine, config: ResolvedModel, key: str, runtime: dict | None = None, ledger: Ledger | None = None
) -> FastAPI:
    """The public app serving ``engine`` as the model entry ``key``; ``runtime``: its BLAS, threads
    and cores; ``ledger``: where each key's use is kept (``vllmmlxd/usage.py``; None: not kept).

    ``app.state.live`` holds its settings, which ``create_private_app`` can replace.
    """
    # An engine may carry the entry's embedding model (worker/main.py: load_engine).
    hub = McpHub(config.mcp_servers_resolved, model=key)
    live = LiveContext(
        engine,
        config,
        key,
        runtime,
        embedder=getattr(engine, "embedder", None),
        mcp=hub,
    )
    stuck_after = stuck_after_s()
    app = FastAPI(
        title=f"vllmmlxd: {live.current.name}",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=hub.lifespan,
    )  # MCP servers connect when serving starts, stop at its end
    app.state.live = live
    install_error_handlers(app)

    async def guard(request: Request) -> None:
        # Every /v1 route: take this request's settings once, know the caller (401/403), then
        # spend its request budgets (429). A wrong key spends its address's budget: guessing is limited too.
        ctx = live.capture(request)
        access, quotas = ctx.access, ctx.quotas
        assert access is not None and quotas is not None  # LiveContext builds both
        try:
            caller = access.identify(request)
        except Unauthorized:
            quotas.admit(Caller(identity="addr:" + access.client_address(request)))
            raise
        request.state.caller = caller
        setattr(request.state, STATE_KEY, quotas.admit(caller))
        if ledger is not None:  # a budget counts every worker's use of the key (429 once it is spent)
            check_budget(ledger, caller, request.method, request.url.path, time.time())

    def key_if(flag: str) -> params.Depends:
        # /health and /metrics stay open for probes and scrapers unless the entry says otherwise.
        async def check(request: Request) -> None:
            access = live.current.access
            if getattr(live.current.config, flag):
                assert access is not None  # LiveContext builds it
                access.identify(request)

        return Depends(check)

    api_deps = [Depends(guard)]
    app.state.activity = Activity()  # what idle unloading reads (the private /health's load.idle_s, keep_alive_s)
    app.include_router(make_openai_router(live), dependencies=api_deps)
    app.include_router(make_anthropic_router(live), dependencies=api_deps)
    app.include_router(make_responses_router(live), dependencies=api_deps)
    app.include_router(make_embeddings_router(live), dependencies=api_deps)
    app.include_router(make_rerank_router(live), dependencies=api_deps)
    app.include_router(make_audio_router(live), dependencies=api_deps)
    app.include_router(make_mcp_router(live), dependencies=api_deps)
    app.include_router(make_tokenizer_router(live), dependencies=api_deps)
    app.include_router(make_ollama_router(live, app.state.activity), dependencies=api_deps)

    # Always built, counted only while enable_metrics is on: the switch is a live setting.
    metrics = Metrics(engine, live.current.name, embedder=live.current.embedder)
    if ledger is not None:
        metrics.registry.register(KeyUsageCollector(ledger, lambda: live.current.name))
    metrics.registry.register(TraceCollector())
    app.add_middleware(MetricsMiddleware, metrics=metrics, enabled=lambda: live.current.config.enable_metrics)

    @app.get("/metrics", dependencies=[key_if("metrics_requires_key")])
    async def prometheus_metrics() -> Response:
        if not live.current.config.enable_metrics:
            raise HTTPException(404, "Not Found")  # as if the route did not exist
        return metrics.response()

    @app.get("/health", dependencies=[key_if("health_requires_key")])
    async def health() -> JSONResponse:
        return health_response(engine, stuck_after, {"model": live.current.name})

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @app.get("/v1/status", dependencies=api_deps, response_model=None)
    async def status(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        s = engine.stats
        with s.lock:  # a step's count beside that step's progress, never the one before's
            steps, requests = s.steps_executed, s.active_requests(owner_of(request))
        return {
            "status": "running",
            "model": ctx.name,
            "source": shown_source(engine.info.source),
            "uptime_s": round(time.time() - ctx.started, 1),
            "steps_executed": steps,
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "tokens_per_second": s.tokens_per_second(),
            "total_requests_processed": s.total_requests_processed,
            "total_prompt_tokens": s.total_prompt_tokens,
            "total_completion_tokens": s.total_completion_tokens,
            "context_length": engine.info.context_length,
            "vision": engine.info.vision,
            # Decoded image pixels held (the worker's, every key's together: a count, no content).
            "images": ctx.pixels.describe() if engine.info.vision and ctx.pixels is not None else None,
            "metal": engine.memory(),
            "cache": engine.cache_status(),
            "kv_budget": kv_of(engine),
            "speculative": speculation_of(engine),
            "layout": layout_of(engine),
            "runtime": ctx.runtime,
            "requests": requests,
            "embedding": ctx.embedder.describe() if ctx.embedder is not None else None,
            "rerank": rerank_of(engine),
            "speech": speech_of(engine),
            "distributed": distributed_of(engine),
        }

    TRACING.configure(config.telemetry)  # the process's traces (http/tracing.py); a settings push swaps them
    app.add_middleware(TracingMiddleware, model=lambda: live.current.name)
    app.add_middleware(RateLimitHeaders)
    app.add_middleware(ActivityMiddleware, activity=app.state.activity)
    install_openapi(app)  # app.openapi(): bodies, statuses and keys, never served (openapi_url is None)
    app.add_middleware(BrowserDefences, config=lambda: live.current.config)  # web pages must not drive the API
    # One line per request, refusals too; model= is the entry's name, as on the worker's other lines.
    record = recorder(ledger, lambda: live.current.key) if ledger is not None else None
    app.add_middleware(AccessLogMiddleware, model=lambda: live.current.key, record=record)
    app.add_middleware(RequestIdMiddleware)  # outermost: every response, errors included, gets its id
    return app


def create_private_app(public: FastAPI, engine: Engine) -> FastAPI:
    """The daemon's app on the private Unix socket: ``GET /health`` and ``POST /internal/settings``."""
    live: LiveContext = public.state.live
    stuck_after = stuck_after_s()
    app = FastAPI(title="vllmmlxd worker (private)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> JSONResponse:
        ctx = live.current
        return health_response(
            engine,
            stuck_after,
            {
                "model": ctx.name,
                "config_hash": ctx.config.config_hash(),
                "runtime": ctx.runtime,
                "load": {**load(engine, ctx.mcp), **public.state.activity.load()},
            },
        )

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @app.post("/internal/settings", response_model=None)
    async def settings(request: Request) -> JSONResponse | dict[str, Any]:
        try:
            data = await request.json()
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack
            data = None
        try:
            new, keys = judge_update(live.current.config, data)
        except SettingsRefused as refused:
            log_event(
                logger,
                "settings.refused",
                logging.WARNING,
                model=live.current.key,
                status=refused.status,
                forcing=",".join(refused.forcing) or None,
            )
            return JSONResponse(
                {"ok": False, "error": refused.message, "forcing": list(refused.forcing)}, status_code=refused.status
            )
        apply_settings(live, engine, new)
        config_hash = new.config_hash()
        log_event(
            logger, "settings.applied", model=live.current.key, keys=",".join(keys) or "none", config_hash=config_hash
        )
        return {"ok": True, "config_hash": config_hash, "changed": list(keys)}

    return app


def apply_settings(live: LiveContext, engine: Engine, config: ResolvedModel) -> None:
    """New requests run under ``config``; the engine's admission takes its queue bound."""
    live.swap(config)
    if hasattr(engine, "max_queue"):  # read at each admission by the engine
        engine.max_queue = config.max_queue
    set_kv_budget = getattr(engine, "set_kv_budget", None)
    if set_kv_budget is not None:  # read at each admission too; the engine ignores an unchanged value
        set_kv_budget(config.max_kv_memory_mb)


def health_response(engine: Engine, stuck_after: float, extra: dict) -> JSONResponse:
    """``{"status": "ok"}`` (200), or ``degraded`` (503) while work waits on a silent engine thread."""
    state, silent = engine_health(engine.stats, time.monotonic(), stuck_after)
    body = {"status": state, **extra, "version": __version__, "commit": commit()}
    if state == DEGRADED:
        body["stalled_s"] = silent
    return JSONResponse(body, status_code=503 if state == DEGRADED else 200)


def load(engine: Engine, mcp: McpHub | None = None) -> dict:
    """What the daemon shows of a worker's work: requests, recent speed, prefix cache against its budget."""
    cache = engine.cache_status()
    return {
        "running": engine.stats.num_running,
        "waiting": engine.stats.num_waiting,
        "tokens_per_s": engine.stats.tokens_per_second(),
        "cache_mb": cache["memory_mb"],
        "cache_budget_mb": cache["budget_mb"],
        **_disk_load(cache.get("disk")),
        **_embedding_load(getattr(engine, "embedder", None)),
        **({"vision": True} if engine.info.vision else {}),
        **({"kv": _kv_load(kv)} if (kv := kv_of(engine)) else {}),
        **({"speculative": spec} if (spec := speculation_of(engine)) else {}),
        **({"distributed": dist} if (dist := distributed_of(engine)) else {}),
        **({"speech": speech} if (speech := speech_of(engine)) else {}),
        **({"mcp": mcp.status()} if mcp is not None and mcp.servers else {}),
    }


def kv_of(engine: Engine) -> dict | None:
    """The engine's KV budget of running requests (``MLXEngine.kv_status``); None: an engine without one."""
    status = getattr(engine, "kv_status", None)
    return status() if status is not None else None


def _kv_load(kv: dict) -> dict:
    """What ``vllmmlxctl status`` shows of the KV budget."""
    return {key: kv.get(key) for key in ("budget_mb", "reserved_mb", "held_mb", "running", "waiting")}


def _disk_load(disk: dict | None) -> dict:
    """The prefix cache's disk tier's use against its budget, for ``vllmmlxctl status``; nothing without one."""
    if not disk or "used_mb" not in disk:
        return {}
    return {"cache_disk_mb": disk["used_mb"], "cache_disk_budget_mb": disk["budget_mb"]}


def speculation_of(engine: Engine) -> dict | None:
    """The engine's speculative decoding counters (``MLXEngine.speculation_status``); None: off."""
    status = getattr(engine, "speculation_status", None)
    return status() if status is not None else None


def layout_of(engine: Engine) -> dict | None:
    """What the model's layers keep and what the engine does with them (``MLXEngine.layout_status``)."""
    status = getattr(engine, "layout_status", None)
    return status() if status is not None else None


def speech_of(engine: Engine) -> dict | None:
    """A speech entry's model, queue and counters (``SpeechOnlyEngine.speech_status``); None for other entries."""
    status = getattr(engine, "speech_status", None)
    return status() if status is not None else None


def rerank_of(engine: Engine) -> dict | None:
    """A reranking entry's model and counters (``MLXReranker.describe``); None for other entries."""
    reranker = getattr(engine, "reranker", None)
    return reranker.describe() if reranker is not None else None


def distributed_of(engine: Engine) -> dict | None:
    """A distributed entry's ranks (``MLXEngine.distributed_status``); None for one process."""
    status = getattr(engine, "distributed_status", None)
    return status() if status is not None else None


def _embedding_load(embedder: Embedder | None) -> dict:
    """The embedding model's name and counters, for ``vllmmlxctl status``; nothing without one."""
    if embedder is None:
        return {}
    return {
        "embedding_model": embedder.info.name,
        "embedding_requests": embedder.stats.requests,
        "embedding_inputs": embedder.stats.inputs,
    }
