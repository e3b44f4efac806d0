"""Who is calling, and may they use this model: the key check of every guarded route.

A model entry is open (no ``api_key``, no ``api_keys``), or it names the keys that may use
it. A worker holds only digests: its entry's own ``api_key`` and the named keys of the
config's ``api_keys`` section, each marked allowed here or not. A missing or unknown key
is a 401; a known key that may not use this model is a 403.

Who the client is (its limits are counted by address when it has no key) is the peer's address,
or behind one of ``trusted_proxies`` the nearest hop of ``X-Forwarded-For`` they did not write.
The daemon's own gateway proves itself otherwise: it sends the token the daemon gave it and its
workers (``gateway_token``), and the client's address as it judged it. Loopback alone proves
nothing: any local program can connect to a worker and write ``X-Forwarded-For``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr
from starlette.requests import Request

from ..config.keys import DIGEST_PREFIX, KeyGrant
from ..errors import Forbidden, Unauthorized

OWN_KEY = "api_key"  # the name the entry's own api_key goes by
GATEWAY_TOKEN_HEADER = "x-vllmmlxd-gateway-token"  # the daemon's token, sent by its gateway alone
GATEWAY_CLIENT_HEADER = "x-vllmmlxd-client"  # the client's address, as the gateway judged it


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest().encode()


@dataclass(frozen=True)
class Caller:
    """The client of one request: ``key`` is the grant it authenticated with (None on an open
    model), ``identity`` what its limits are counted under."""

    identity: str
    key: KeyGrant | None = None

    @property
    def key_name(self) -> str | None:
        return self.key.name if self.key else None


def presented_key(request: Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``x-api-key``."""
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    return given or None


class AccessSettings(Protocol):
    """What the key table is built from: a resolved model entry, or one route of the gateway."""

    @property
    def is_open(self) -> bool: ...
    @property
    def trusted_proxies(self) -> tuple[str, ...]: ...
    @property
    def key_grants(self) -> tuple[KeyGrant, ...]: ...
    @property
    def api_key(self) -> SecretStr | None: ...
    @property
    def gateway_token(self) -> SecretStr | None: ...


class Access:
    """One entry's key table, built from its config (rebuilt when the settings change)."""

    def __init__(self, config: AccessSettings):
        self.open = config.is_open
        self.proxies = tuple(ipaddress.ip_network(p, strict=False) for p in config.trusted_proxies)
        grants = list(config.key_grants)
        if config.api_key is not None:
            digest = config.api_key.get_secret_value().removeprefix(DIGEST_PREFIX)
            grants.insert(0, KeyGrant(name=OWN_KEY, sha256=digest, allowed=True))
        self.grants = tuple(grants)
        token = getattr(config, "gateway_token", None)
        self._gateway = _digest(token.get_secret_value()) if token is not None else None

    def identify(self, request: Request) -> Caller:
        """The caller, or ``Unauthorized`` / ``Forbidden``."""
        if self.open:
            # Every SDK sends some key even to an open server: it is not looked at here.
            return Caller(identity="addr:" + self.client_address(request))
        given = presented_key(request)
        grant = self.match(given) if given else None
        if grant is None:
            raise Unauthorized("missing or invalid API key", code="invalid_api_key")
        if not grant.allowed:
            raise Forbidden(f"the key {grant.name!r} may not use this model", code="model_not_allowed")
        return Caller(identity="key:" + grant.name, key=grant)

    def match(self, given: str) -> KeyGrant | None:
        """The grant whose digest is the given key's, compared in constant time against every grant."""
        digest = _digest(given)
        found = None
        for grant in self.grants:  # no early exit: the time taken does not say which grant matched
            if secrets.compare_digest(digest, grant.sha256.encode()) and found is None:
                found = grant
        return found

    def client_address(self, request: Request) -> str:
        """The peer's address; behind a trusted proxy, the nearest untrusted X-Forwarded-For hop."""
        peer = request.client.host if request.client else "unknown"
        if self.from_gateway(request):
            return request.headers.get(GATEWAY_CLIENT_HEADER) or peer
        if not self.proxies or not self._trusted(peer):
            return peer  # a client's own X-Forwarded-For is never believed
        hops = [h.strip() for h in ",".join(request.headers.getlist("x-forwarded-for")).split(",") if h.strip()]
        for hop in reversed(hops):  # the right end was written by the proxies we trust
            if not self._trusted(hop):
                return hop
        return hops[0] if hops else peer

    def from_gateway(self, request: Request) -> bool:
        """Does the request carry the daemon's gateway token? (Compared as digests, in constant time.)"""
        expected = self._gateway
        given = request.headers.get(GATEWAY_TOKEN_HEADER) if expected is not None else None
        return expected is not None and given is not None and secrets.compare_digest(_digest(given), expected)

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.proxies)
