"""The worker's HTTP app: health, status, metrics and the API families over one engine."""

from __future__ import annotations

import time

from fastapi import Depends, FastAPI
from starlette.requests import Request

from ..api.anthropic.routes import make_router as make_anthropic_router
from ..api.context import ServingContext
from ..api.errors import install_error_handlers
from ..api.openai.routes import make_router as make_openai_router
from ..config.schema import ModelConfig
from ..engine.types import Engine
from ..http.auth import make_auth
from ..http.metrics import Metrics, MetricsMiddleware
from ..http.ratelimit import make_rate_limit
from ..http.request_id import RequestIdMiddleware


def create_app(engine: Engine, config: ModelConfig, key: str, runtime: dict | None = None) -> FastAPI:
    """A FastAPI app serving ``engine`` as the model entry ``key``; ``runtime``: its BLAS, threads and cores."""
    ctx = ServingContext(engine=engine, config=config, key=key, runtime=runtime or {})
    app = FastAPI(title=f"vllmmlxd: {ctx.name}", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    install_error_handlers(app)
    # Every /v1 route is behind the rate limit, then the key, by construction; /health and
    # /metrics are not. The limit comes first so that guessing keys spends a budget too.
    api_deps = [Depends(make_rate_limit(config.rate_limit, config.api_key)), Depends(make_auth(config.api_key))]
    app.include_router(make_openai_router(ctx), dependencies=api_deps)
    app.include_router(make_anthropic_router(ctx), dependencies=api_deps)

    if config.enable_metrics:
        metrics = Metrics(engine, ctx.name)
        app.add_middleware(MetricsMiddleware, metrics=metrics)

        @app.get("/metrics")
        async def prometheus_metrics():
            return metrics.response()  # unauthenticated, as the reference server's

    @app.get("/health")
    async def health(request: Request):
        body = {"status": "ok", "model": ctx.name}
        if request.client is None:  # the daemon's private Unix socket: it shows these in `vllmmlxctl status`
            body["runtime"] = ctx.runtime
            body["load"] = load(engine)
        return body

    @app.get("/v1/status", dependencies=api_deps)
    async def status():
        s = engine.stats
        return {
            "status": "running",
            "model": ctx.name,
            "source": engine.info.source,
            "uptime_s": round(time.time() - ctx.started, 1),
            "steps_executed": s.steps_executed,
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "tokens_per_second": s.tokens_per_second(),
            "total_requests_processed": s.total_requests_processed,
            "total_prompt_tokens": s.total_prompt_tokens,
            "total_completion_tokens": s.total_completion_tokens,
            "context_length": engine.info.context_length,
            "metal": engine.memory(),
            "cache": engine.cache_status(),
            "runtime": ctx.runtime,
            "requests": s.active_requests(),
        }

    app.add_middleware(RequestIdMiddleware)  # outermost: every response, errors included, gets its id
    return app


def load(engine: Engine) -> dict:
    """What the daemon shows of a worker's work: requests, recent speed, prefix cache against its budget."""
    cache = engine.cache_status()
    return {
        "running": engine.stats.num_running,
        "waiting": engine.stats.num_waiting,
        "tokens_per_s": engine.stats.tokens_per_second(),
        "cache_mb": cache["memory_mb"],
        "cache_budget_mb": cache["budget_mb"],
    }
