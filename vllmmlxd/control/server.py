"""The daemon's control API: HTTP over a Unix socket that only the daemon's user can reach.

``make_control_app`` turns a ``ControlTarget`` (the supervisor) into routes;
``serve_control`` runs it with uvicorn on a socket we bind ourselves, because
uvicorn's own ``uds=`` makes the socket world-writable (0666).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

import uvicorn
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from vllmmlxd.control.protocol import (
    ControlTarget,
    ErrorResponse,
    LogsResponse,
    PullRequest,
    PullsResponse,
    PullStatus,
)
from vllmmlxd.errors import StoreBusy, StoreError
from vllmmlxd.log import log_event
from vllmmlxd.sockets import bind_unix
from vllmmlxd.store.catalog import NotInStore
from vllmmlxd.store.sources import parse_source

logger = logging.getLogger("vllmmlxd.control")

# Requests still running when the daemon stops (a `logs -f`) are cancelled after this long.
_GRACEFUL_S = 2.0


def make_control_app(target: ControlTarget) -> FastAPI:  # noqa: C901 - a factory: its count is the routes it defines, each simple
    """The control API over ``target``: status, reload, per-model restart/stop/start/load and logs
    (``load``: the gateway's request for a lazy model, answered once it is ready), and the model
    store: what it holds, removing a model, and pulls (started, joined, followed, cancelled)."""
    app = FastAPI(title="vllmmlxd control", docs_url=None, redoc_url=None, openapi_url=None)

    def unknown(name: str, exc: KeyError) -> JSONResponse:
        names = [m.name for m in target.status().models]
        if name in names:
            raise exc  # a KeyError about something else: a bug, answered as a 500
        return _error(404, f"no model named {name!r}; models: {', '.join(names) or '(none)'}")

    # Routes are async so the target is only ever called on the daemon's event loop, never a thread.
    @app.get("/status")
    async def status() -> JSONResponse:
        await target.refresh()
        return JSONResponse(target.status().model_dump(mode="json"))

    @app.post("/reload")
    async def reload(dry_run: bool = False, file: str | None = None) -> JSONResponse:
        if file is not None and not dry_run:
            return _error(422, "file: only a dry run can read another file")
        result = await target.reload(dry_run=dry_run, file=file)
        return JSONResponse(result.model_dump(mode="json"), status_code=200 if result.ok else 409)

    @app.post("/models/{name}/{action}")
    async def act(name: str, action: Literal["restart", "stop", "start", "load"]) -> JSONResponse:
        try:
            result = await getattr(target, action)(name)
        except KeyError as e:
            return unknown(name, e)
        return JSONResponse(result.model_dump(mode="json"), status_code=200 if result.ok else 409)

    @app.get("/models/{name}/logs")
    async def logs(name: str, lines: int = Query(100, ge=0, le=100_000), follow: bool = False) -> Response:
        stream = None
        try:
            # Ask for the stream first: a target that subscribes when called loses no line in between.
            stream = target.follow(name) if follow else None
            backlog = target.logs(name, lines)
        except KeyError as e:
            if stream is not None:
                await _close(stream)
            return unknown(name, e)
        if stream is None:
            return JSONResponse(LogsResponse(lines=backlog).model_dump(mode="json"))
        return StreamingResponse(_lines(backlog, stream), media_type="text/plain; charset=utf-8")

    @app.get("/usage")
    async def usage(since: float = Query(86_400, gt=0, le=400 * 86_400)) -> JSONResponse:
        return JSONResponse((await target.usage(since)).model_dump(mode="json"))

    # -- the model store ---------------------------------------------------------------------------

    @app.get("/store")
    async def store() -> JSONResponse:
        return JSONResponse((await target.store()).model_dump(mode="json"))

    @app.delete("/store/models/{name:path}")
    async def remove(name: str) -> JSONResponse:
        if ".." in name.split("/") or name.startswith("/"):
            return _error(404, f"{name!r} is not a model of the store")
        try:
            result = await target.remove(name)
        except NotInStore as e:
            return _error(404, str(e))
        except StoreError as e:
            return _error(409, str(e))
        return JSONResponse(result.model_dump(mode="json"))

    @app.post("/store/pulls")
    async def pull(request: PullRequest) -> JSONResponse:
        try:
            source = parse_source(request.source, request.revision, os.environ.get("HF_ENDPOINT"))
        except StoreError as e:
            return _error(422, str(e))
        try:
            status = await target.pull(source)
        except StoreBusy as e:
            return _error(503, str(e))
        except StoreError as e:
            return _error(409, str(e))
        return JSONResponse(status.model_dump(mode="json"))

    @app.get("/store/pulls")
    async def pulls() -> JSONResponse:
        return JSONResponse(PullsResponse(pulls=target.pulls()).model_dump(mode="json"))

    @app.get("/store/pulls/{pull_id}")
    async def pull_status(pull_id: str, follow: bool = False) -> Response:
        try:
            if not follow:
                return JSONResponse(target.pull_status(pull_id).model_dump(mode="json"))
            stream = target.follow_pull(pull_id)
            first = await anext(aiter(stream))  # an unknown id is a 404, not an empty stream
        except (KeyError, StopAsyncIteration):
            return _error(404, f"no pull {pull_id!r}; pulls: {', '.join(p.id for p in target.pulls()) or '(none)'}")
        return StreamingResponse(_statuses(first, stream), media_type="application/x-ndjson")

    @app.delete("/store/pulls/{pull_id}")
    async def cancel_pull(pull_id: str) -> JSONResponse:
        try:
            status = await target.cancel_pull(pull_id)
        except KeyError:
            return _error(404, f"no pull {pull_id!r}")
        return JSONResponse(status.model_dump(mode="json"))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = ("{}: {}".format(".".join(map(str, e["loc"][1:])) or e["loc"][0], e["msg"]) for e in exc.errors())
        return _error(422, "; ".join(parts))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log_event(logger, "control.error", logging.ERROR, path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    return app


def _error(status_code: int, message: str) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=message).model_dump(), status_code=status_code)


async def _lines(backlog: list[str], stream: AsyncIterator[str]) -> AsyncIterator[str]:
    try:
        for line in backlog:
            yield line.rstrip("\r\n") + "\n"
        async for line in stream:
            yield line.rstrip("\r\n") + "\n"
    finally:
        # Runs when the client goes away too: the target can drop its subscriber.
        await _close(stream)


async def _statuses(first: PullStatus, stream: AsyncIterator[PullStatus]) -> AsyncIterator[str]:
    """One JSON line per change of a pull; a follower that leaves stops following, never the pull."""
    try:
        yield first.model_dump_json() + "\n"
        async for status in stream:
            yield status.model_dump_json() + "\n"
    finally:
        await _close(stream)


async def _close(stream: AsyncIterator) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: the daemon owns SIGTERM, SIGINT and SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        pass


class ControlServer:
    """A running control API: ``await stop()`` ends it and removes its socket file."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task, path: Path, inode: int):
        self.server = server
        self.task = task
        self.path = path
        self._inode = inode

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to a couple of seconds), unlink the socket."""
        self.server.should_exit = True
        try:
            await self.task
        finally:
            self._unlink()

    def _unlink(self) -> None:
        # Only our own socket: another daemon may have taken the path since.
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)


async def serve_control(app: FastAPI, path: Path) -> ControlServer:
    """Bind ``path`` (mode 0600, parent made 0700) and serve ``app`` on it until ``stop()``.

    A stale socket file is replaced; a live one (another daemon), a file that is not a socket
    or a failed bind raise ``OSError`` naming the path.
    """
    path = Path(path)
    _check_free(path)
    try:
        sock = bind_unix(path)
    except OSError as e:
        raise OSError(e.errno, f"cannot bind the control socket {path}: {e.strerror or e}") from None
    inode = os.stat(path).st_ino
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        # uvicorn types it int but hands it to asyncio.wait_for, which takes a float.
        timeout_graceful_shutdown=_GRACEFUL_S,  # type: ignore[arg-type]
    )
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="control-server")
    while not server.started:
        if task.done():
            sock.close()
            task.result()  # raises what stopped it
            raise OSError(f"the control server on {path} stopped during start-up")
        await asyncio.sleep(0.01)
    log_event(logger, "control.listening", socket=str(path))
    return ControlServer(server, task, path, inode)


def _check_free(path: Path) -> None:
    """Refuse to take a path another daemon answers on, or a file that is not a socket."""
    if path.is_socket():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return  # nobody listening: a stale file from a daemon that died
        finally:
            probe.close()
        raise OSError(errno.EADDRINUSE, f"another vllmmlxd is already listening on {path}")
    if path.exists() or path.is_symlink():
        raise FileExistsError(
            errno.EEXIST, f"{path} exists and is not a socket; remove it or set daemon.control_socket"
        )
