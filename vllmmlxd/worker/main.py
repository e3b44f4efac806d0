"""A worker process: load one model, serve it over HTTP until told to stop.

Run by the daemon as ``python -m vllmmlxd.worker --name NAME --fd N --health-socket PATH``
with its ModelConfig as one JSON line on stdin; stdin staying open is the daemon's
lifeline (EOF means the daemon is gone, so the worker drains and exits). Run by
hand through ``vllmmlxd serve MODEL``, it binds host:port itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from ..config.schema import ModelConfig
from ..errors import ModelLoadError
from ..http.drain import CloseWhenDraining
from ..log import log_event, setup_logging
from ..paths import ensure_private_dir, resolve_state_dir
from ..runtime import cpus as cpu_shares
from ..runtime.blas import ActiveBlas, BlasInfo, activate
from ..runtime.memory import read_machine_memory
from ..sockets import bind_tcp, bind_unix, http_url, is_loopback

logger = logging.getLogger("vllmmlxd.worker")

EXIT_LOAD_FAILED = 3
EXIT_BIND_FAILED = 4


def _entry_from(line: bytes, key: str) -> ModelConfig | None:
    """The model entry the daemon sent, or None (logged) when it is not one.

    Never a traceback: pydantic's would print the input values, and the entry holds key digests.
    """
    from pydantic import ValidationError

    try:
        return ModelConfig.model_validate(json.loads(line))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                             for e in exc.errors(include_input=False, include_url=False))
    except ValueError:
        problems = "stdin did not carry one JSON line"
    log_event(logger, "worker.bad_config", logging.ERROR, model=key, error=problems)
    return None


def choose_blas(config: ModelConfig, cpus: tuple[int, ...] | None, state_dir: Path) -> ActiveBlas:
    """Load the BLAS MLX will use (before mlx is imported), with this worker's thread count."""
    threads = config.threads or len(cpus or cpu_shares.available_cpus())
    return activate(config.blas, threads, memo_dir=state_dir / "blas")


def runtime_report(info: BlasInfo, key: str, cpus: tuple[int, ...] | None) -> dict:
    """What /v1/status and the daemon show of the process: BLAS, threads, cores; logged once."""
    report = {
        "blas": info.name, "blas_path": info.path, "threads": info.threads,
        "cpus": cpu_shares.format_cpus(cpus or cpu_shares.available_cpus()), "pinned": cpus is not None,
    }
    if info.warning:
        log_event(logger, "blas.fallback" if info.name == "bundled" else "blas.warning", logging.WARNING,
                  model=key, requested=info.requested, blas=info.name, reason=info.warning)
        report["blas_warning"] = info.warning
    tried = " ".join(f"{name}:{ms}ms" for name, ms in info.timings.items())  # auto's measurements
    log_event(logger, "blas.selected", model=key, blas=info.name, path=info.path, threads=info.threads,
              cpus=report["cpus"], tried=tried or None,
              **{k.lower(): v for k, v in info.env.items() if k != "OMP_NUM_THREADS"})
    return report


def load_engine(config: ModelConfig, key: str, state_dir: Path):
    """Load the model and start its engine thread (imports mlx: workers only).

    An entry whose model is an embedding model gets an engine that only embeds; an entry
    with ``embedding_model`` gets its embedder loaded too, carried as ``engine.embedder``.
    """
    from ..engine.embedder import EmbeddingsOnlyEngine, is_embedding_spec, load_embedder
    from ..engine.loader import load_model
    from ..engine.mlx_engine import MLXEngine
    from ..engine.options import engine_options

    started = time.perf_counter()
    if is_embedding_spec(config.model):
        if config.embedding_model:
            raise ModelLoadError(f"{config.model} is an embedding model; embedding_model cannot be set beside it")
        engine = EmbeddingsOnlyEngine(load_embedder(config.model, state_dir), name=config.display_name(key))
        log_event(logger, "model.loaded", model=key, source=config.model, embeddings_only=True,
                  load_s=round(time.perf_counter() - started, 2))
        return engine
    embedder = load_embedder(config.embedding_model, state_dir) if config.embedding_model else None
    loaded = load_model(config.model, state_dir, trust_remote_code=config.trust_remote_code)
    options = engine_options(config, read_machine_memory(working_set=False).physical or 0)
    engine = MLXEngine(loaded, name=config.display_name(key), options=options)
    if embedder is not None:
        engine.embedder = embedder  # app.py hands it to the API layer
        embedder.share_engine_thread(engine)  # its batches go between decode steps (engine/embedder.py)
        close_engine = engine.close

        def close_both() -> None:
            embedder.close()
            close_engine()

        engine.close = close_both
    log_event(
        logger, "model.loaded", model=key, source=config.model,
        context=engine.info.context_length, load_s=round(time.perf_counter() - started, 2),
        batching=options.continuous_batching, max_num_seqs=options.max_running,
        cache_budget_mb=round(options.cache_budget_bytes / 1024**2),
        embedding_model=config.embedding_model,
    )
    return engine


def _watch_parent(fd: int) -> None:
    """Block until the daemon's end of stdin closes, then stop (gracefully, then for sure)."""
    try:  # os.read, not sys.stdin: a buffered reader's lock breaks interpreter shutdown
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
    log_event(logger, "worker.orphaned", logging.WARNING, reason="daemon pipe closed")
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Timer(15.0, lambda: os._exit(1)).start()


def serve(
    config: ModelConfig,
    key: str,
    *,
    state_dir: Path,
    listen: socket.socket | None = None,
    health_socket: Path | None = None,
    drain_timeout: float = 30.0,
    log_level: str = "info",
    cpus: tuple[int, ...] | None = None,
) -> int:
    """Load the model, then serve it until SIGTERM/SIGINT. Returns the exit code.

    ``cpus`` is the share of cores the daemon gave this worker (already pinned); None: all.
    """
    state_dir = ensure_private_dir(state_dir)  # sockets and converted models: this user's only
    active_blas = choose_blas(config, cpus, state_dir)  # before anything imports mlx

    import uvicorn

    from ..engine.blas_check import confirm
    from .app import create_app, create_private_app
    from .testing import install_test_hooks

    runtime = runtime_report(confirm(active_blas), key, cpus)
    try:
        engine = load_engine(config, key, state_dir)
    except Exception as exc:
        log_event(logger, "model.load_failed", logging.ERROR, model=key, source=config.model, error=str(exc))
        return EXIT_LOAD_FAILED
    if listen is None:
        try:
            listen = bind_tcp(config.host, config.port)
        except OSError as exc:
            log_event(logger, "worker.bind_failed", logging.ERROR, host=config.host, port=config.port, error=exc.strerror)
            engine.close()
            return EXIT_BIND_FAILED
    private_socket = bind_unix(health_socket) if health_socket is not None else None
    install_test_hooks(engine)
    app = create_app(engine, config, key, runtime=runtime)
    uv_config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=drain_timeout,
        timeout_keep_alive=5,
        log_level=log_level,
        **_client_bounds(config),
    )
    server = _make_server_class()(uv_config)
    app.add_middleware(CloseWhenDraining, draining=lambda: server.draining)
    private = None
    if private_socket is not None:
        logging.getLogger("uvicorn.error").addFilter(_not_private_routine)
        private = _private_server(uvicorn.Config(
            create_private_app(app, engine), lifespan="off", log_config=None, access_log=False,
            timeout_graceful_shutdown=2, log_level=log_level,
        ))
    host, port = listen.getsockname()[:2]
    if config.is_open and not is_loopback(str(host)):
        log_event(logger, "worker.open_to_network", logging.WARNING, model=key, url=http_url(host, port),
                  hint="anyone who can reach this address can use the model: set api_keys or api_key, or bind 127.0.0.1")
    log_event(logger, "worker.listening", model=key, pid=os.getpid(), url=http_url(host, port),
              health_socket=str(health_socket) if health_socket else None)
    try:
        asyncio.run(_serve_both(server, listen, private, private_socket))
    finally:
        engine.close()
        if health_socket is not None:
            health_socket.unlink(missing_ok=True)
    log_event(logger, "worker.shutdown", model=key, pid=os.getpid())
    return 0


async def _serve_both(server, listen: socket.socket, private, private_socket: socket.socket | None) -> None:
    """The public server until it stops; the private one beside it, answering only once the
    public one is up (the daemon takes a health answer as "ready") and stopping after it."""
    public = asyncio.create_task(server.serve(sockets=[listen]))
    if private is None:
        await public
        return
    while not server.started and not public.done():
        await asyncio.sleep(0.02)
    inner = asyncio.create_task(_quietly(private.serve(sockets=[private_socket])))
    try:
        await public
    finally:
        private.should_exit = True
        await asyncio.gather(inner, return_exceptions=True)


# Set inside the private server's task: its start and stop lines would repeat the public
# server's ("Started server process"), so they are dropped; its warnings are kept.
_PRIVATE = contextvars.ContextVar("vllmmlxd_private_server", default=False)


async def _quietly(coro):
    _PRIVATE.set(True)  # a task runs in its own copy of the context: only this server is quiet
    return await coro


def _not_private_routine(record: logging.LogRecord) -> bool:
    return not (_PRIVATE.get() and record.levelno < logging.WARNING)


def _private_server(config):
    """uvicorn for the daemon's socket, leaving signals to the public server."""
    import contextlib

    import uvicorn

    class PrivateServer(uvicorn.Server):
        def capture_signals(self):  # uvicorn >= 0.29
            return contextlib.nullcontext()

        def install_signal_handlers(self) -> None:  # older uvicorn
            pass

    return PrivateServer(config)


def _client_bounds(config: ModelConfig) -> dict:
    """uvicorn settings that bound slow and greedy clients; the timeouts' env is read here, once."""
    from ..http.slow_clients import MAX_HEAD_BYTES, body_timeout_s, header_timeout_s, protocol_class

    return {
        # h11 always (not httptools when installed): the head cap and timeouts are built on it.
        "http": protocol_class(header_timeout_s(), body_timeout_s()),
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
        # uvicorn refuses once open connections reach the limit, the asking one included.
        "limit_concurrency": config.max_connections + 1,
        "proxy_headers": False,  # the client address is the socket's; trusted proxies are the app's call
    }


def _make_server_class():
    import uvicorn

    class WorkerServer(uvicorn.Server):
        """uvicorn, draining without racing keep-alive clients, and exiting 0 after a drain."""

        draining = False

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful shutdown; a drained worker exits 0.
            getattr(self, "_captured_signals", []).clear()

        async def shutdown(self, sockets=None) -> None:
            # Stop accepting, then let open connections end on their own (responses now say
            # Connection: close, idle ones time out) before uvicorn closes what is left.
            for server in self.servers:
                server.close()
            self.draining = True
            deadline = time.monotonic() + self.config.timeout_keep_alive + 1
            while self.server_state.connections and time.monotonic() < deadline and not self.force_exit:
                await asyncio.sleep(0.05)
            await super().shutdown(sockets)

    return WorkerServer


def _read_line(fd: int) -> bytes:
    """One line from ``fd``, unbuffered, so nothing after it is swallowed."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data


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
    line = _read_line(sys.stdin.fileno())
    config = _entry_from(line, args.name)
    if config is None:  # the daemon marks the model failed at once, as for a model that cannot load
        return EXIT_LOAD_FAILED
    threading.Thread(target=_watch_parent, args=(sys.stdin.fileno(),), daemon=True).start()
    listen = socket.socket(fileno=args.fd) if args.fd is not None else None
    return serve(
        config, args.name, state_dir=resolve_state_dir(args.state_dir), listen=listen,
        health_socket=args.health_socket, drain_timeout=args.drain_timeout, log_level=args.log_level,
        cpus=args.cpus if args.cpus and cpu_shares.can_pin() else None,
    )
