"""Browser defences: a web page must not be able to drive this API.

A worker usually listens on loopback without a key, trusting that only local programs reach
it. A browser on the same machine is a local program that runs anyone's script: a page can
post to ``http://127.0.0.1:PORT`` with a form or ``fetch(..., {mode: "no-cors"})`` (no
preflight for ``text/plain`` or form bodies), or rebind its own DNS name to 127.0.0.1 and
read the answers too. So, per request and under the current settings:

- Host: the name the client asked for must be ours (bind address, loopback names,
  ``allowed_hosts``); a rebound name is not. Bound to a wildcard with no ``allowed_hosts``,
  any Host is taken (the operator chose to be reached under any name).
- Origin: a request from a page (``Origin``, ``null`` included) is refused unless its origin
  is in ``cors_origins`` or it is our own origin under a Host we recognise.
- Content-Type: a POST must say JSON, which a page cannot send cross-origin without a
  preflight; a plain ``curl -d`` (no browser markers) may still send none or a form type.
- CORS headers only when ``cors_origins`` lists origins, answered as Starlette's middleware
  does for them, preflights without the key (browsers never send credentials there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from .error_shapes import render_error

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
BROWSER_MARKERS = ("origin", "sec-fetch-site", "sec-fetch-mode")
# What curl -d sends, or nothing: taken from non-browser clients only, read as JSON anyway.
LENIENT_TYPES = frozenset({"", "application/x-www-form-urlencoded"})
# Any request header, for the listed origins only: the browser SDKs send their own
# (x-stainless-*, anthropic-dangerous-direct-browser-access), and a fixed list would fail their preflights.
CORS_ALLOW_HEADERS = ("*",)
CORS_EXPOSE_HEADERS = (
    "x-request-id",
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# OpenAI's upload routes take multipart forms: from a program, or from a page whose origin passed the check.
UPLOAD_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})


def split_host(value: str, scheme: str = "http") -> tuple[str, int | None]:
    """``(hostname, port)`` of a Host header value: lower case, IPv6 without brackets, the
    port None when absent or not a number (then the scheme's default applies)."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:  # a bare name, or a bare IPv6 address (not valid in Host, but unambiguous)
        name, port = value, ""
    name = name.rstrip(".")  # "localhost." is localhost
    return name, int(port) if port.isdigit() else _DEFAULT_PORTS.get(scheme)


class BrowserSettings(Protocol):
    """What the checks read: a model entry's settings, or the gateway's."""

    @property
    def host(self) -> str: ...
    @property
    def allowed_hosts(self) -> tuple[str, ...]: ...
    @property
    def cors_origins(self) -> tuple[str, ...]: ...


def host_is_known(hostname: str, config: BrowserSettings) -> bool:
    """Is ``hostname`` one this server answers as: its bind address, loopback, or ``allowed_hosts``."""
    if hostname in LOOPBACK_NAMES or hostname == config.host.lower().strip("[]").rstrip("."):
        return True
    for allowed in config.allowed_hosts:
        allowed = allowed.lower().strip().strip("[]").rstrip(".")
        if allowed == "*" or hostname == allowed or (allowed.startswith("*.") and hostname.endswith(allowed[1:])):
            return True
    return False


def host_refusal(host: str | None, config: BrowserSettings) -> str | None:
    """Why a request under this Host header is refused (DNS rebinding), or None."""
    if host is None:  # HTTP/1.0 without Host: no name to have been rebound
        return None
    hostname, _ = split_host(host)
    if host_is_known(hostname, config):
        return None
    if config.host in WILDCARD_BINDS and not config.allowed_hosts:
        return None
    return (
        f"host {hostname!r} is not served here; if this server should answer under that name, add it to allowed_hosts"
    )


def same_origin(origin: str, host: str | None, scheme: str) -> bool:
    """Is ``origin`` (``scheme://host[:port]``) the origin the Host header names (host and port)."""
    origin_scheme, sep, rest = origin.partition("://")
    if not sep or host is None or "/" in rest:
        return False
    return split_host(rest, origin_scheme.lower()) == split_host(host, scheme)


def origin_refusal(origin: str | None, host: str | None, scheme: str, config: BrowserSettings) -> str | None:
    """Why a request from the web page at ``origin`` is refused, or None (no page, or one we trust)."""
    if origin is None or origin in config.cors_origins or "*" in config.cors_origins:
        return None
    # Our own origin counts only under a Host we recognise: under "any Host" a rebound name
    # would be its own origin.
    if same_origin(origin, host, scheme) and host_is_known(split_host(host or "")[0], config):
        return None
    return (
        f"requests from the web page at origin {origin!r} are refused; to allow that page, "
        f"add its origin to cors_origins"
    )


def is_json_type(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def content_type_refusal(method: str, headers: Headers, path: str = "") -> str | None:
    """Why a POST's Content-Type is refused, or None. A page can POST ``text/plain``, forms and
    multipart across origins without a preflight; JSON it cannot. An upload route takes multipart
    from a program, or from a page that names its origin (the origin check ran before this)."""
    if method != "POST":
        return None
    content_type = headers.get("content-type", "")
    if is_json_type(content_type):
        return None
    from_browser = any(name in headers for name in BROWSER_MARKERS)
    media = content_type.partition(";")[0].strip().lower()
    if path in UPLOAD_PATHS and media == "multipart/form-data" and (not from_browser or "origin" in headers):
        return None
    if not from_browser and content_type.partition(";")[0].strip().lower() in LENIENT_TYPES:
        return None
    shown = content_type.partition(";")[0].strip() or "none"
    return f"request body type {shown!r} is not accepted: send Content-Type: application/json"


class _ContentTypeGate:
    """The Content-Type check, inside the CORS layer so an allowed page can read the refusal."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = content_type_refusal(scope["method"], Headers(scope=scope), scope.get("path", ""))
        if reason is None:
            await self.app(scope, receive, send)
            return
        await render_error(Request(scope), 415, reason, "invalid_request_error")(scope, receive, send)


class BrowserDefences:
    """Pure ASGI middleware applying the checks above under ``config()``, read per request."""

    def __init__(self, app: ASGIApp, config: Callable[[], BrowserSettings]):
        self.config = config
        self.gated = _ContentTypeGate(app)
        # cors_origins is a live setting: one CORS layer per distinct origin list seen.
        self._cors: dict[tuple[str, ...], CORSMiddleware] = {}

    def cors_for(self, origins: tuple[str, ...]) -> CORSMiddleware:
        layer = self._cors.get(origins)
        if layer is None:
            if len(self._cors) > 16:  # settings pushes are rare; never let this grow without bound
                self._cors.clear()
            layer = self._cors[origins] = CORSMiddleware(
                self.gated,
                allow_origins=origins,
                allow_methods=("GET", "POST", "OPTIONS"),
                allow_headers=CORS_ALLOW_HEADERS,
                expose_headers=CORS_EXPOSE_HEADERS,
            )
        return layer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.gated.app(scope, receive, send)
            return
        config = self.config()
        headers = Headers(scope=scope)
        host = headers.get("host")
        reason = host_refusal(host, config) or origin_refusal(
            headers.get("origin"), host, scope.get("scheme", "http"), config
        )
        if reason is not None:
            await render_error(Request(scope), 403, reason, "permission_error")(scope, receive, send)
            return
        app = self.cors_for(tuple(config.cors_origins)) if config.cors_origins else self.gated
        await app(scope, receive, send)
