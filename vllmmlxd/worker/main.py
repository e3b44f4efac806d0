"""A worker process: load one model, serve it over HTTP until told to stop.

Run by the daemon as ``python -m vllmmlxd.worker --name NAME --fd N --health-socket PATH``
with its ResolvedModel as one JSON line on stdin; stdin staying open is the daemon's
lifeline (EOF means the daemon is gone, so the worker drains and exits). Run by
hand through ``vllmmlxd serve MODEL``, it binds host:port itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.schema import ResolvedModel
from ..errors import ModelLoadError
from ..http.serving import make_servers, read_line, serve_both, start_lifeline
from ..log import log_event, setup_logging
from ..paths import ensure_private_dir, resolve_state_dir
from ..runtime import cpus as cpu_shares
from ..runtime.blas import ActiveBlas, BlasInfo, activate
from ..runtime.memory import read_machine_memory
from ..sockets import bind_tcp, bind_unix, http_url, is_loopback
from ..usage import FILE as USAGE_FILE
from ..usage import Ledger

if TYPE_CHECKING:  # the engine's modules import mlx: loaded in load_engine, after the BLAS choice
    from ..engine.mlx_engine import MLXEngine
    from ..engine.options import EngineOptions
    from ..engine.types import Engine

logger = logging.getLogger("vllmmlxd.worker")

EXIT_LOAD_FAILED = 3
EXIT_BIND_FAILED = 4


def _entry_from(line: bytes, key: str) -> ResolvedModel | None:
    """The model entry the daemon sent, or None (logged) when it is not one.

    Never a traceback: pydantic's would print the input values, and the entry holds key digests.
    """
    from pydantic import ValidationError

    try:
        return ResolvedModel.model_validate(json.loads(line))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
    except ValueError:
        problems = "stdin did not carry one JSON line"
    log_event(logger, "worker.bad_config", logging.ERROR, model=key, error=problems)
    return None


def choose_blas(config: ResolvedModel, cpus: tuple[int, ...] | None, state_dir: Path) -> ActiveBlas:
    """Load the BLAS MLX will use (before mlx is imported), with this worker's thread count."""
    threads = config.threads or cpu_shares.default_threads(len(cpus or cpu_shares.available_cpus()))
    return activate(config.blas, threads, memo_dir=state_dir / "blas")


def runtime_report(info: BlasInfo, key: str, cpus: tuple[int, ...] | None) -> dict:
    """What /v1/status and the daemon show of the process: BLAS, threads, cores; logged once."""
    report = {
        "blas": info.name,
        "blas_path": info.path,
        "threads": info.threads,
        "cpus": cpu_shares.format_cpus(cpus or cpu_shares.available_cpus()),
        "pinned": cpus is not None,
    }
    if info.warning:
        log_event(
            logger,
            "blas.fallback" if info.name == "bundled" else "blas.warning",
            logging.WARNING,
            model=key,
            requested=info.requested,
            blas=info.name,
            reason=info.warning,
        )
        report["blas_warning"] = info.warning
    tried = " ".join(f"{name}:{ms}ms" for name, ms in info.timings.items())  # auto's measurements
    log_event(
        logger,
        "blas.selected",
        model=key,
        blas=info.name,
        path=info.path,
        threads=info.threads,
        cpus=report["cpus"],
        tried=tried or None,
        **{k.lower(): v for k, v in info.env.items() if k != "OMP_NUM_THREADS"},
    )
    return report


def load_engine(config: ResolvedModel, key: str, state_dir: Path) -> Engine:
    """Load the model and start its engine thread (imports mlx: workers only).

    An entry whose model is an embedding model gets an engine that only embeds, and one whose
    model is a reranker (or that says ``task: rerank``) one that only reranks; an entry with
    ``embedding_model`` gets its embedder loaded too, carried as ``engine.embedder``.
    """
    from ..engine.embeddings.embedder import is_embedding_spec, load_embedder
    from ..engine.loading.loader import load_model
    from ..engine.mlx_engine import MLXEngine
    from ..engine.options import engine_options
    from ..engine.rerank.reranker import is_rerank_spec
    from ..engine.speech.transcriber import is_speech_spec

    started = time.perf_counter()
    if is_rerank_spec(config.model, config.task):
        return _task_engine("rerank", config, key, state_dir)
    if is_speech_spec(config.model, state_dir):
        return _task_engine("speech", config, key, state_dir)
    if is_embedding_spec(config.model):
        return _task_engine("embedding", config, key, state_dir)
    embedder = load_embedder(config.embedding_model, state_dir) if config.embedding_model else None
    machine = read_machine_memory(working_set=False)  # Metal's working set: asked of mlx by the engine
    options = engine_options(config, machine.physical or 0, machine.source, state_dir=state_dir)
    if config.distributed is not None:
        engine = _rank_zero_engine(config, key, state_dir, options)
    else:
        loaded = load_model(config.model, state_dir, trust_remote_code=config.trust_remote_code)
        spec = config.speculative
        draft = load_model(spec.draft_model, state_dir) if spec is not None and spec.draft_model else None
        engine = MLXEngine(loaded, name=config.display_name(key), options=options, draft=draft)
    if embedder is not None:
        engine.embedder = embedder  # app.py hands it to the API layer; engine.close closes it too
        embedder.share_engine_thread(engine)  # its batches go between decode steps (engine/embeddings/embedder.py)
    log_event(
        logger,
        "model.loaded",
        model=key,
        source=config.model,
        context=engine.info.context_length,
        load_s=round(time.perf_counter() - started, 2),
        batching=options.continuous_batching,
        max_num_seqs=options.max_running,
        cache_budget_mb=round(options.cache_budget_bytes / 1024**2),
        embedding_model=config.embedding_model,
    )
    return engine


# What an entry whose model does not generate is, in its refusal of an embedding_model beside it.
TASK_MODELS = {
    "rerank": "is served as a reranker",
    "speech": "is a speech model",
    "embedding": "is an embedding model",
}


def _task_engine(kind: str, config: ResolvedModel, key: str, state_dir: Path) -> Engine:
    """An entry whose model only embeds, reranks or transcribes: its engine refuses generation
    (engine/task_engine.py), and no embedding model can sit beside it."""
    if config.embedding_model:
        raise ModelLoadError(f"{config.model} {TASK_MODELS[kind]}; embedding_model cannot be set beside it")
    started = time.perf_counter()
    name = config.display_name(key)
    engine: Engine
    if kind == "rerank":
        from ..engine.rerank.reranker import RerankOnlyEngine, load_reranker

        engine = RerankOnlyEngine(
            load_reranker(config.model, state_dir, trust_remote_code=config.trust_remote_code), name=name
        )
        fields: dict[str, object] = {"rerank": engine.reranker.info.kind}
    elif kind == "speech":
        from ..engine.speech.speech_engine import SpeechOnlyEngine
        from ..engine.speech.transcriber import load_transcriber

        engine = SpeechOnlyEngine(
            load_transcriber(config.model, state_dir, name=name, max_queue=config.max_queue), name=name
        )
        fields = {"speech": True}
    else:
        from ..engine.embeddings.embedder import EmbeddingsOnlyEngine, load_embedder

        engine = EmbeddingsOnlyEngine(load_embedder(config.model, state_dir), name=name)
        fields = {"embeddings_only": True}
    log_event(
        logger, "model.loaded", model=key, source=config.model, **fields, load_s=round(time.perf_counter() - started, 2)
    )
    return engine


def _rank_zero_engine(config: ResolvedModel, key: str, state_dir: Path, options: EngineOptions) -> MLXEngine:
    """Rank 0 of a distributed entry: join the other ranks, load its share, lead them."""
    from ..config.distributed import share_text
    from ..engine.distributed.lockstep import Leader
    from ..engine.distributed.rank_group import join
    from ..engine.distributed.ring_link import RingLink
    from ..engine.mlx_engine import MLXEngine
    from .ranks import load_share

    joined = join(config)
    loaded = load_share(config, joined, state_dir)
    engine = MLXEngine(loaded, name=config.display_name(key), options=options, lockstep=Leader(RingLink(joined.group)))
    engine.ranks = joined.ranks  # what each rank said at the handshake: host and pid, for status
    dist = config.distributed
    assert dist is not None
    engine.distribution = {
        "backend": dist.resolved_backend(),
        "parallel": dist.parallel,
        "shares": [share_text(config.model, dist, r) for r in range(dist.world)],
    }
    return engine


def serve(
    config: ResolvedModel,
    key: str,
    *,
    state_dir: Path,
    listen: socket.socket | None = None,
    health_socket: Path | None = None,
    drain_timeout: float = 30.0,
    log_level: str = "info",
    cpus: tuple[int, ...] | None = None,
) -> int:
    """Bind (unless given a socket), load the model, then serve it until SIGTERM/SIGINT. Returns the exit code.

    ``cpus`` is the share of cores the daemon gave this worker (already pinned); None: all.
    """
    if listen is None:
        # Before the BLAS probe and the load: a busy port is known in a moment, not after minutes of loading.
        try:
            listen = bind_tcp(config.host, config.port)
        except OSError as exc:
            log_event(
                logger,
                "worker.bind_failed",
                logging.ERROR,
                host=config.host,
                port=config.port,
                error=exc.strerror,
                hint="another server listens there: stop it, or choose another --port",
            )
            return EXIT_BIND_FAILED
    state_dir = ensure_private_dir(state_dir)  # sockets and converted models: this user's only
    active_blas = choose_blas(config, cpus, state_dir)  # before anything imports mlx

    from ..engine.loading.blas_check import confirm
    from .app import create_app, create_private_app
    from .testing import install_test_hooks

    runtime = runtime_report(confirm(active_blas), key, cpus)
    from .ranks import EXIT_RANK_FAILED, RankLost

    try:
        engine = load_engine(config, key, state_dir)
    except RankLost as exc:  # another rank did not come (or left): a restart of the unit may do
        log_event(logger, "rank.lost", logging.ERROR, model=key, error=str(exc))
        listen.close()
        return EXIT_RANK_FAILED
    except Exception as exc:
        log_event(logger, "model.load_failed", logging.ERROR, model=key, source=config.model, error=str(exc))
        listen.close()
        return EXIT_LOAD_FAILED
    private_socket = bind_unix(health_socket) if health_socket is not None else None
    install_test_hooks(engine)
    ledger = Ledger(state_dir / USAGE_FILE)  # each key's use, beside every other worker's (vllmmlxd/usage.py)
    app = create_app(engine, config, key, runtime=runtime, ledger=ledger)
    server, private = make_servers(
        app,
        create_private_app(app, engine) if private_socket is not None else None,
        drain_timeout=drain_timeout,
        log_level=log_level,
        max_connections=config.max_connections,
    )
    host, port = listen.getsockname()[:2]
    if config.is_open and not is_loopback(str(host)):
        log_event(
            logger,
            "worker.open_to_network",
            logging.WARNING,
            model=key,
            url=http_url(host, port),
            hint="anyone who can reach this address can use the model: set api_keys or api_key, or bind 127.0.0.1",
        )
    log_event(
        logger,
        "worker.listening",
        model=key,
        pid=os.getpid(),
        url=http_url(host, port),
        health_socket=str(health_socket) if health_socket else None,
    )
    try:
        asyncio.run(serve_both(server, listen, private, private_socket))
    finally:
        engine.close()
        ledger.close()  # what was recorded since the last second reaches the file
        if health_socket is not None:
            health_socket.unlink(missing_ok=True)
    log_event(logger, "worker.shutdown", model=key, pid=os.getpid())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllmmlxd.worker", description="one vllmmlxd model worker")
    parser.add_argument("--name", required=True, help="the model entry's name")
    parser.add_argument("--fd", type=int, help="an inherited listening socket to serve on")
    parser.add_argument("--health-socket", type=Path, help="a Unix socket for the daemon's health checks")
    parser.add_argument("--state-dir")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--cpus", type=cpu_shares.parse_cpus, help="the cores to run on (0-3,6): this worker's share")
    args = parser.parse_args(argv)
    if args.cpus:  # before any thread starts, so every thread inherits it
        cpu_shares.pin(args.cpus)
    setup_logging(args.log_level, model=args.name)
    # The config arrives on stdin so secrets never show in `ps`.
    line = read_line(sys.stdin.fileno())
    config = _entry_from(line, args.name)
    if config is None:  # the daemon marks the model failed at once, as for a model that cannot load
        return EXIT_LOAD_FAILED
    start_lifeline(sys.stdin.fileno(), logger, "worker.orphaned")
    listen = socket.socket(fileno=args.fd) if args.fd is not None else None
    return serve(
        config,
        args.name,
        state_dir=resolve_state_dir(args.state_dir),
        listen=listen,
        health_socket=args.health_socket,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
        cpus=args.cpus if args.cpus and cpu_shares.can_pin() else None,
    )
