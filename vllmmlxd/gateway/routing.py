"""The routing table: which route answers a request's ``model``. Pure: built from a GatewaySpec.

A request may name a route by its served name, its entry key or one of its aliases; an
embeddings request may also name the route's embedding model. Routes that share a ``group``
form a ``ReplicaSet`` answered under the group's name (each member keeps its own names too):
``resolve`` gives the set, and the gateway picks a member per request (``balance.py``). The
table is immutable and replaced whole at each settings push, so a request that took a route
keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import SecretStr
from starlette.requests import Request

from ..api.responses.ids import response_tag, tag_of
from ..config.gateway import GatewaySpec, Route
from ..config.groups import set_state as member_states
from ..config.keys import KeyGrant
from ..errors import InvalidRequest, ModelNotFound
from ..http.access import Access

# States in which a lazy model needs no load before a request is sent to it.
SERVING_STATES = frozenset({"ready", "idle"})
# A local model starting (or not yet shown, in a spec built before its state was known).
STARTING_STATES = frozenset({"starting", "unknown"})
# A lazy model in these states is healthy: it will be loaded on the first request.
LAZY_HEALTHY_STATES = frozenset({"ready", "idle", "unloaded", "loading"})


class TableError(ValueError):
    """The spec cannot be routed (two routes claim one name)."""


@dataclass(frozen=True)
class _RouteKeys:
    """A route's key fields in the shape ``Access`` reads (``http.access.AccessSettings``)."""

    is_open: bool
    trusted_proxies: tuple[str, ...]
    key_grants: tuple[KeyGrant, ...]
    api_key: SecretStr | None
    gateway_token: SecretStr | None = None  # the gateway's clients are never the gateway


def route_access(route: Route | None, trusted_proxies: tuple[str, ...]) -> Access:
    """The key check of one route (None: an open one, for the client's address alone): ``Access``
    reads a config's key fields and trusted proxies."""
    return Access(
        _RouteKeys(
            is_open=route is None or route.is_open,
            trusted_proxies=trusted_proxies,
            key_grants=route.key_grants if route else (),
            api_key=route.api_key if route else None,
        )
    )


@dataclass(frozen=True)
class ReplicaSet:
    """Entries answered under one group name; their keys agree (config/groups.py), so the first
    member's check is the set's."""

    name: str
    members: tuple[Route, ...]
    kind: str = "group"
    embedding_model: None = None

    @property
    def served_model_name(self) -> str:
        return self.name

    @property
    def first(self) -> Route:
        return self.members[0]

    @property
    def is_open(self) -> bool:
        return self.first.is_open


Target = Route | ReplicaSet  # what a request's model names


@dataclass(frozen=True)
class Table:
    spec: GatewaySpec
    by_name: dict[str, Route] = field(default_factory=dict)
    sets: dict[str, ReplicaSet] = field(default_factory=dict)
    by_embedding: dict[str, Route] = field(default_factory=dict)
    access: dict[str, Access] = field(default_factory=dict)  # by entry key
    peers: Access | None = None  # who the client is, behind the gateway's trusted proxies

    @property
    def routes(self) -> tuple[Route, ...]:
        return self.spec.routes

    def names(self, embeddings: bool = False, key: str | None = None) -> list[str]:
        """The names to show a client who named none or a wrong one: served names (and embedding models)
        of the routes its ``key`` may use, and no others."""
        routes = self.visible(key)
        shown = [r.served_model_name for r in routes]
        shown += [s.name for s in self.sets.values() if self.may_use(s, key)]
        if embeddings:
            shown += [r.embedding_model for r in routes if r.embedding_model]
        return list(dict.fromkeys(shown))

    def visible(self, key: str | None) -> list[Route]:
        """The routes a caller presenting ``key`` may use: all it may learn of (listings, health, errors)."""
        return [r for r in self.routes if self.may_use(r, key)]

    def client_address(self, request: Request) -> str:
        """The client's address as the gateway judges it (its peer, or behind a trusted proxy, the client)."""
        assert self.peers is not None
        return self.peers.client_address(request)

    def lookup(self, model: str, embeddings: bool = False) -> Target | None:
        if embeddings and model in self.by_embedding:
            return self.by_embedding[model]
        return self.by_name.get(model) or self.sets.get(model)

    def by_response(self, response_id: str, key: str | None) -> Route | None:
        """The route whose worker made a stored response (its id names the model), if the caller may use it."""
        tag = tag_of(response_id)
        if tag is None:
            return None
        return next((r for r in self.visible(key) if response_tag(r.served_model_name) == tag), None)

    def access_of(self, target: Target) -> Access:
        """The key check of a route, or of a set (its first member's: the members' keys agree)."""
        return self.access[target.first.name if isinstance(target, ReplicaSet) else target.name]

    def resolve(self, model: object, embeddings: bool = False, key: str | None = None) -> Target:
        """The route for a request's ``model``: 400 when missing (and not implied), 404 when unknown.
        The names listed are those ``key`` may use."""
        if model is None or model == "":
            if len(self.routes) == 1:
                return self.routes[0]
            raise InvalidRequest(
                f"model is required; available models: {', '.join(self.names(embeddings, key)) or 'none'}",
                param="model",
                code="model_required",
            )
        if not isinstance(model, str):
            raise InvalidRequest("model must be a string", param="model")
        route = self.lookup(model, embeddings)
        if route is None:
            raise ModelNotFound(
                f"model {model!r} does not exist; available models: {', '.join(self.names(embeddings, key)) or 'none'}"
            )
        return route

    def may_use(self, route: Target, key: str | None) -> bool:
        """May a caller presenting ``key`` use ``route`` or a set (what /v1/models and /api/models show)."""
        if route.is_open:
            return True
        grant = self.access_of(route).match(key) if key else None
        return grant is not None and grant.allowed

    def may_use_every(self, key: str | None) -> bool:
        """May a caller presenting ``key`` use every route: what the daemon's own business (the model
        store's pulls, seen or started) asks of a caller. True for anyone when every route is open."""
        return all(self.may_use(r, key) for r in self.routes)

    def visible_sets(self, key: str | None) -> list[ReplicaSet]:
        return [s for s in self.sets.values() if self.may_use(s, key)]


def build_table(spec: GatewaySpec) -> Table:
    """The table of ``spec``; ``TableError`` when two routes claim one name."""
    by_name: dict[str, Route] = {}
    by_embedding: dict[str, Route] = {}
    for route in spec.routes:
        for name in route.names():
            other = by_name.setdefault(name, route)
            if other is not route:
                raise TableError(f"routes {other.name!r} and {route.name!r} both answer to the name {name!r}")
        if route.embedding_model:
            # Two entries may embed with the same model: the first one listed answers its name.
            by_embedding.setdefault(route.embedding_model, route)
    groups: dict[str, list[Route]] = {}
    for route in spec.routes:
        if route.group is not None:
            if route.group in by_name:
                raise TableError(f"group {route.group!r} is also a name of route {by_name[route.group].name!r}")
            groups.setdefault(route.group, []).append(route)
    sets = {name: ReplicaSet(name, tuple(members)) for name, members in groups.items()}
    proxies = spec.gateway.trusted_proxies
    access = {r.name: route_access(r, proxies) for r in spec.routes}
    return Table(
        spec=spec,
        by_name=by_name,
        sets=sets,
        by_embedding=by_embedding,
        access=access,
        peers=route_access(None, proxies),
    )


def needs_load(route: Route) -> bool:
    """Must the daemon load this route's model before a request can go to it?"""
    return route.kind == "local" and route.load == "lazy" and route.state not in SERVING_STATES


def set_state(members: tuple[Route, ...]) -> str:
    """A set's state as listings show it: ``ready`` while a member serves, else its most hopeful member's."""
    return member_states([m.state for m in members])


def serving(route: Route) -> bool:
    """May a request be sent to this route's address now? A local model only while the daemon shows it
    ready (or idle): its port is then the daemon's socket and its worker the daemon's. In any other state
    (failed, say because another program holds the port) the address may be anyone's: nothing is sent."""
    return route.kind == "upstream" or route.state in SERVING_STATES


def coming_up(route: Route) -> bool:
    """Is this local model on its way to ready (the daemon's push saying so may be a moment behind)?"""
    return route.kind == "local" and route.state in STARTING_STATES


def route_ok(route: Route) -> bool:
    """Is this route answering, or (lazy) ready to be loaded on demand?"""
    if route.kind == "local" and route.load == "lazy":
        return route.state in LAZY_HEALTHY_STATES
    return route.state in SERVING_STATES


def set_health(
    rset: ReplicaSet, outstanding: Mapping[str, int], ejected: frozenset[str] = frozenset()
) -> dict[str, object]:
    """One set's line of ``/api/health``: its state, and each member's state, requests in flight
    through this gateway, and whether it is ejected after a refused connection."""
    return {
        "state": set_state(rset.members),
        "ok": any(route_ok(m) for m in rset.members),
        "members": {
            m.name: {"state": m.state, "outstanding": outstanding.get(m.name, 0), "ejected": m.name in ejected}
            for m in rset.members
        },
    }


def health_summary(routes: tuple[Route, ...], shown: list[Route] | None = None) -> tuple[str, dict[str, dict]]:
    """``ok`` when every route is fine, ``down`` when none is, else ``degraded``; and the line of each
    route in ``shown`` (default: all), so a caller learns only of the models it may use."""
    fine = sum(route_ok(r) for r in routes)
    if fine == len(routes):
        status = "ok"
    elif fine == 0:
        status = "down"
    else:
        status = "degraded"
    models = {
        r.name: {"state": r.state, "model": r.served_model_name, "ok": route_ok(r)}
        for r in (routes if shown is None else shown)
    }
    return status, models
