"""A small synchronous client for the daemon's control API over its Unix socket.

Transport failures become ``DaemonUnreachable``; an error body from the daemon
becomes ``ControlRequestError``. A failed reload or action is not an exception:
its response says ``ok: false`` and why.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import quote

import httpx

from vllmmlxd.control.protocol import (
    ENV_SOCKET,
    SOCKET_NAME,
    ActionResponse,
    LogsResponse,
    PullsResponse,
    PullStatus,
    ReloadResponse,
    StatusResponse,
    StoreResponse,
    UsageResponse,
    control_socket_path,
)
from vllmmlxd.errors import VllmmlxdError
from vllmmlxd.paths import ENV_STATE_DIR

CONNECT_TIMEOUT_S = 2.0
STATUS_TIMEOUT_S = 15.0
# A reload or restart answers once the new workers are ready, and loading a model takes a while.
SLOW_TIMEOUT_S = 600.0


class DaemonUnreachable(VllmmlxdError):
    """Nothing answered on the control socket (or it stopped answering)."""

    def __init__(self, socket_path: Path, reason: str):
        super().__init__(f"cannot reach the daemon at {socket_path}: {reason} (is vllmmlxd running?)")
        self.socket_path = socket_path
        self.reason = reason


class ControlRequestError(VllmmlxdError):
    """The daemon answered with an error body (an unknown model is a 404)."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


# Where `brew install` puts Homebrew: Apple silicon's prefix, then Intel's.
HOMEBREW_PREFIXES = (Path("/opt/homebrew"), Path("/usr/local"))
HOMEBREW_ORIGIN = "Homebrew's service"
DEFAULT_ORIGIN = "the default"


def homebrew_prefixes(environ: Mapping[str, str], executable: str) -> list[Path]:
    """Where a Homebrew install of vllmmlxd may be, most likely first: ``$HOMEBREW_PREFIX``, the prefix
    ``executable`` runs from (``<prefix>/Cellar/vllmmlxd/...`` or ``<prefix>/opt/vllmmlxd/...``), then
    Homebrew's defaults."""
    found = [Path(environ["HOMEBREW_PREFIX"])] if environ.get("HOMEBREW_PREFIX") else []
    parts = Path(executable).parts
    for i in range(2, len(parts) - 1):  # from 2: the prefix is a folder below /, never / itself
        if parts[i] in ("Cellar", "opt") and parts[i + 1] == "vllmmlxd":
            found.append(Path(*parts[:i]))
            break
    return list(dict.fromkeys([*found, *HOMEBREW_PREFIXES]))


def homebrew_socket(environ: Mapping[str, str], executable: str) -> Path | None:
    """The control socket of the daemon ``brew services`` runs (its config keeps state in
    ``<prefix>/var/vllmmlxd``), when one of :func:`homebrew_prefixes` has it; else None."""
    for prefix in homebrew_prefixes(environ, executable):
        candidate = prefix / "var" / "vllmmlxd" / SOCKET_NAME
        if candidate.exists():
            return candidate
    return None


def locate_socket(
    socket: str | None = None,
    config: str | None = None,
    environ: Mapping[str, str] = os.environ,
    executable: str = sys.executable,
) -> tuple[Path, str]:
    """The control socket and, in words, where it was taken from (see :func:`resolve_socket`)."""
    if socket:
        return Path(socket).expanduser(), "--socket"
    if environ.get(ENV_SOCKET):
        return Path(environ[ENV_SOCKET]).expanduser(), f"${ENV_SOCKET}"
    if config:
        daemon = _daemon_section(config)
        path = control_socket_path(daemon.get("control_socket"), daemon.get("state_dir"))
        return path, f"the daemon section of {config}"
    default = control_socket_path()
    # A state dir named in $VLLMMLXD_STATE_DIR is a choice: only the platform's default gives way.
    if not environ.get(ENV_STATE_DIR) and not default.exists():
        brewed = homebrew_socket(environ, executable)
        if brewed is not None:
            return brewed, HOMEBREW_ORIGIN
    return default, DEFAULT_ORIGIN


def resolve_socket(
    socket: str | None = None,
    config: str | None = None,
    environ: Mapping[str, str] = os.environ,
    executable: str = sys.executable,
) -> Path:
    """``--socket``, else ``$VLLMMLXD_SOCKET``, else the ``--config`` file's daemon section, else the
    default; when the default socket is absent (and ``$VLLMMLXD_STATE_DIR`` unset), the socket of
    Homebrew's service if there is one."""
    return locate_socket(socket, config, environ, executable)[0]


def socket_origin(
    socket: str | None = None,
    config: str | None = None,
    environ: Mapping[str, str] = os.environ,
    executable: str = sys.executable,
) -> str:
    """Where ``resolve_socket`` took the path from, in words: ``--socket``, ``$VLLMMLXD_SOCKET``,
    ``the daemon section of FILE``, ``Homebrew's service`` or ``the default``."""
    return locate_socket(socket, config, environ, executable)[1]


def unreachable_hint(origin: str) -> str:
    """What to try when nothing answered on the socket taken from ``origin``."""
    if origin == "--socket":
        return "check the path, or pass --config FILE (the daemon's config) to find its socket"
    if origin.startswith("the daemon section"):
        return "is the daemon running with this config? Else pass its own --config FILE or --socket PATH"
    if origin == HOMEBREW_ORIGIN:
        # Its socket is there, so the service ran: it stopped, or crashed and launchd gave up.
        return (
            "is it running? `brew services info vllmmlxd` says; its log is "
            "$(brew --prefix)/var/log/vllmmlxd/vllmmlxd.log. Another daemon: pass --config FILE or --socket PATH"
        )
    # A daemon run with a config that sets daemon.control_socket or daemon.state_dir (as a
    # system service usually is) listens elsewhere than this user's default.
    return (
        "if the daemon runs with a config that sets daemon.control_socket or daemon.state_dir "
        "(a system service, another user), pass --config FILE or --socket PATH"
    )


def _daemon_section(config: str) -> dict:
    # Only the daemon section is read, and not validated: the daemon's ${env:..} secrets
    # need not be set in this shell just to find its socket.
    import yaml

    try:
        with open(config, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise VllmmlxdError(f"{config}: cannot read: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise VllmmlxdError(f"{config}: not a readable config (try `vllmmlxctl check {config}`): {e}") from None
    daemon = data.get("daemon") if isinstance(data, dict) else None
    return daemon if isinstance(daemon, dict) else {}


class ControlClient:
    """Calls the control API at ``socket_path``; use as a context manager or call ``close()``."""

    def __init__(self, socket_path: Path, connect_timeout: float = CONNECT_TIMEOUT_S):
        self.socket_path = Path(socket_path)
        self.connect_timeout = connect_timeout
        # No TLS on a Unix socket: verify=False skips loading the CA store.
        transport = httpx.HTTPTransport(uds=str(self.socket_path), verify=False)
        self._http = httpx.Client(transport=transport, base_url="http://vllmmlxd")

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def status(self) -> StatusResponse:
        """``GET /status``."""
        return StatusResponse.model_validate(self._call("GET", "/status", STATUS_TIMEOUT_S))

    def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadResponse:
        """``POST /reload``; a failed reload comes back with ``ok=False`` and its error.

        ``file`` (dry runs only): preview that file against the running config instead of the
        daemon's own config file; sent as the ``file`` query parameter, an absolute path.
        """
        params = {"dry_run": "true" if dry_run else "false"}
        if file is not None:
            params["file"] = file
        return ReloadResponse.model_validate(self._call("POST", "/reload", SLOW_TIMEOUT_S, params, ok=(409,)))

    def action(self, name: str, verb: str) -> ActionResponse:
        """``POST /models/NAME/VERB`` for ``restart``, ``stop`` or ``start``."""
        data = self._call("POST", f"/models/{_quote(name)}/{verb}", SLOW_TIMEOUT_S, ok=(409,))
        return ActionResponse.model_validate(data)

    def logs(self, name: str, lines: int) -> list[str]:
        """The last ``lines`` stderr lines of model ``name``."""
        data = self._call("GET", f"/models/{_quote(name)}/logs", STATUS_TIMEOUT_S, {"lines": str(lines)})
        return LogsResponse.model_validate(data).lines

    def follow(self, name: str, lines: int) -> Iterator[str]:
        """The last ``lines`` lines, then each new one as it comes, until the daemon ends the stream."""
        params = {"lines": str(lines), "follow": "true"}
        timeout = httpx.Timeout(None, connect=self.connect_timeout)  # a quiet worker is not a dead daemon
        try:
            with self._http.stream("GET", f"/models/{_quote(name)}/logs", params=params, timeout=timeout) as r:
                if r.status_code != 200:
                    r.read()
                    raise _error(r)
                yield from r.iter_lines()
        except httpx.TransportError as e:
            raise DaemonUnreachable(self.socket_path, _reason(e, None)) from None

    def usage(self, since_s: float) -> UsageResponse:
        """``GET /usage``: each key's use of each model over the last ``since_s`` seconds, and budgets."""
        data = self._call("GET", "/usage", SLOW_TIMEOUT_S, {"since": str(since_s)})
        return UsageResponse.model_validate(data)

    # -- the model store --------------------------------------------------------------------------

    def store(self) -> StoreResponse:
        """``GET /store``: the models in the store, with the entries that use each."""
        return StoreResponse.model_validate(self._call("GET", "/store", SLOW_TIMEOUT_S))

    def remove(self, name: str) -> ActionResponse:
        """``DELETE /store/models/NAME``; refused (``ControlRequestError`` 409) while an entry uses it."""
        return ActionResponse.model_validate(self._call("DELETE", f"/store/models/{_quote(name)}", SLOW_TIMEOUT_S))

    def pull(self, source: str, revision: str | None = None) -> PullStatus:
        """``POST /store/pulls``: start pulling ``source`` (or join the pull of it under way)."""
        body = {"source": source, "revision": revision}
        return PullStatus.model_validate(self._call("POST", "/store/pulls", STATUS_TIMEOUT_S, json=body))

    def pulls(self) -> list[PullStatus]:
        """``GET /store/pulls``: running and recently ended pulls."""
        return PullsResponse.model_validate(self._call("GET", "/store/pulls", STATUS_TIMEOUT_S)).pulls

    def cancel_pull(self, pull_id: str) -> PullStatus:
        """``DELETE /store/pulls/ID``."""
        return PullStatus.model_validate(self._call("DELETE", f"/store/pulls/{_quote(pull_id)}", SLOW_TIMEOUT_S))

    def follow_pull(self, pull_id: str) -> Iterator[PullStatus]:
        """The pull now and at each change, until it ends (``GET /store/pulls/ID?follow=true``, one JSON per line)."""
        timeout = httpx.Timeout(None, connect=self.connect_timeout)  # a slow hub is not a dead daemon
        url = f"/store/pulls/{_quote(pull_id)}"
        try:
            with self._http.stream("GET", url, params={"follow": "true"}, timeout=timeout) as r:
                if r.status_code != 200:
                    r.read()
                    raise _error(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield PullStatus.model_validate_json(line)
        except httpx.TransportError as e:
            raise DaemonUnreachable(self.socket_path, _reason(e, None)) from None

    def _call(
        self,
        method: str,
        url: str,
        read_timeout: float,
        params: dict | None = None,
        ok: tuple[int, ...] = (),
        json: dict | None = None,
    ) -> dict:
        timeout = httpx.Timeout(read_timeout, connect=self.connect_timeout)
        try:
            r = self._http.request(method, url, params=params, timeout=timeout, json=json)
        except httpx.TransportError as e:
            raise DaemonUnreachable(self.socket_path, _reason(e, read_timeout)) from None
        if r.status_code != 200 and r.status_code not in ok:
            raise _error(r)
        try:
            return r.json()
        except ValueError:
            raise ControlRequestError(
                r.status_code, f"the daemon sent a body that is not JSON: {r.text[:200]!r}"
            ) from None


def _quote(name: str) -> str:
    return quote(name, safe="")


def _error(r: httpx.Response) -> ControlRequestError:
    try:
        message = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        message = r.text.strip() or r.reason_phrase
    return ControlRequestError(r.status_code, str(message))


def _reason(exc: httpx.TransportError, read_timeout: float | None) -> str:
    """A short reason: the OS's words ("Connection refused") rather than httpx's wrapping."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return f"no answer within {read_timeout:g}s" if read_timeout else "timed out"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__
