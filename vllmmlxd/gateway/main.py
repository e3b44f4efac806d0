"""The gateway process: route every model's requests from one address until told to stop.

Run by the daemon like a worker: ``python -m vllmmlxd.gateway --name gateway --fd N
--health-socket PATH ...`` with its ``GatewaySpec`` as one JSON line on stdin; stdin staying
open is the daemon's lifeline (EOF: drain and exit). Run by hand, ``--host``/``--port`` bind
the address itself. It serves as a worker does (``http/serving.py``); it never imports mlx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from pathlib import Path

from ..config.gateway import GatewaySpec
from ..http.serving import make_servers, read_line, serve_both, start_lifeline
from ..log import log_event, setup_logging
from ..paths import ensure_private_dir, resolve_state_dir
from ..sockets import bind_tcp, bind_unix, http_url

logger = logging.getLogger("vllmmlxd.gateway")

EXIT_BAD_SPEC = 3
EXIT_BIND_FAILED = 4


def spec_from(line: bytes) -> GatewaySpec | None:
    """The spec the daemon sent, or None (logged without values: routes hold key digests)."""
    from pydantic import ValidationError

    try:
        return GatewaySpec.model_validate(json.loads(line))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
    except (ValueError, RecursionError):
        problems = "stdin did not carry one JSON line"
    log_event(logger, "gateway.bad_config", logging.ERROR, error=problems)
    return None


def serve(
    spec: GatewaySpec,
    *,
    state_dir: Path,
    listen: socket.socket | None = None,
    ollama_listen: socket.socket | None = None,
    health_socket: Path | None = None,
    drain_timeout: float = 30.0,
    log_level: str = "info",
) -> int:
    """Serve ``spec`` until SIGTERM/SIGINT (or stdin's EOF). Returns the exit code. ``listen`` and
    ``ollama_listen`` are the daemon's sockets; without ``listen`` (run by hand) both are bound here."""
    from .app import create_app, create_private_app
    from .dispatch import Gateway
    from .ollama import ListenerSplit, create_ollama_app
    from .routing import TableError, build_table

    ensure_private_dir(state_dir)
    try:
        table = build_table(spec)
    except TableError as exc:
        log_event(logger, "gateway.bad_config", logging.ERROR, error=str(exc))
        return EXIT_BAD_SPEC
    if listen is None:
        ollama_port = spec.gateway.ollama_port
        try:
            listen = bind_tcp(spec.host, spec.port)
            ollama_listen = bind_tcp(spec.host, ollama_port) if ollama_port is not None else None
        except OSError as exc:
            log_event(logger, "gateway.bind_failed", logging.ERROR, host=spec.host, error=exc.strerror)
            return EXIT_BIND_FAILED
    private_socket = bind_unix(health_socket) if health_socket is not None else None
    gateway = Gateway(table)
    app = create_app(gateway)
    sockets = [listen]
    if ollama_listen is not None:  # one server on both sockets: Ollama's connections go to its own app
        app.add_middleware(ListenerSplit, ollama=create_ollama_app(gateway), port=ollama_listen.getsockname()[1])
        sockets.append(ollama_listen)
    server, private = make_servers(
        app,
        create_private_app(gateway) if private_socket is not None else None,
        drain_timeout=drain_timeout,
        log_level=log_level,
        max_connections=spec.gateway.max_connections,
    )
    host, port = listen.getsockname()[:2]
    log_event(
        logger,
        "gateway.listening",
        pid=os.getpid(),
        url=http_url(host, port, ""),
        ollama_url=http_url(host, ollama_listen.getsockname()[1], "") if ollama_listen is not None else None,
        routes=len(spec.routes),
        health_socket=str(health_socket) if health_socket else None,
    )

    async def run() -> None:
        try:
            await serve_both(server, sockets, private, private_socket)
        finally:
            await gateway.client.aclose()

    try:
        asyncio.run(run())
    finally:
        if health_socket is not None:
            health_socket.unlink(missing_ok=True)
    log_event(logger, "gateway.shutdown", pid=os.getpid())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllmmlxd.gateway", description="the vllmmlxd gateway")
    parser.add_argument("--name", default="gateway", help="the name its log lines carry")
    parser.add_argument("--fd", type=int, help="an inherited listening socket to serve on")
    parser.add_argument("--ollama-fd", type=int, help="an inherited listening socket for Ollama's API")
    parser.add_argument("--host", help="bind this address (run by hand; overrides gateway.host)")
    parser.add_argument("--port", type=int, help="bind this port (run by hand; overrides gateway.port)")
    parser.add_argument("--health-socket", type=Path, help="a Unix socket for the daemon's health checks and pushes")
    parser.add_argument("--state-dir")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if args.fd is not None and (args.host or args.port):
        parser.error("--fd and --host/--port exclude each other")
    setup_logging(args.log_level, model=args.name)
    # The spec arrives on stdin so secrets never show in `ps`.
    spec = spec_from(read_line(sys.stdin.fileno()))
    if spec is None:
        return EXIT_BAD_SPEC
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        spec = spec.model_copy(update={"gateway": spec.gateway.model_copy(update=overrides)})
    start_lifeline(sys.stdin.fileno(), logger, "gateway.orphaned")
    listen = socket.socket(fileno=args.fd) if args.fd is not None else None
    ollama_listen = socket.socket(fileno=args.ollama_fd) if args.ollama_fd is not None else None
    return serve(
        spec,
        state_dir=resolve_state_dir(args.state_dir),
        listen=listen,
        ollama_listen=ollama_listen,
        health_socket=args.health_socket,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
    )
