"""Which member of a replica set answers a request, and in what order the others are tried. Pure.

A request goes first to the member with the least outstanding work: the fewest requests in
flight through this gateway, then the fewest estimated tokens in flight, then round-robin. A
conversation goes back to the member that answered it last (that member holds its prefix in
cache) while that member is within ``AFFINITY_SLACK`` requests of the least loaded one; a busier
one loses the conversation to load. The conversation is known by its key (``affinity_key``), the
same at every turn of a growing chat. A member the gateway could not connect to is ejected for
``EJECT_S`` (or until the daemon shows it ready again); ejected members are tried last, never
refused outright.

The counts, ejections and affinity live in the gateway's event loop only (``Replicas``): one
writer, no locks.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..config.gateway import Route
from .routing import LAZY_HEALTHY_STATES, ReplicaSet, Table, coming_up, serving

AFFINITY_KEYS = 4096  # conversations remembered, at most
AFFINITY_TTL_S = 1800.0  # a conversation quiet this long is forgotten (its prefix has likely been evicted too)
AFFINITY_SLACK = 2  # requests more than the least loaded member that affinity still accepts
EJECT_S = 5.0  # how long a member that refused a connection gets no new request
PROMPT_CHARS = 512  # the leading part of a completion prompt that names it

# Paths whose bodies carry a conversation (``messages``) or a prompt.
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"})
_PROMPT_PATHS = frozenset({"/v1/completions"})


def _digest(value: object) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def affinity_key(path: str, data: dict) -> str | None:
    """What names a request's conversation, or None (nothing to keep it on one member).

    Chat (OpenAI chat, Anthropic messages): the system prompt and the messages up to and including
    the first user message, which stay the same as the chat grows. Completions: the prompt's first
    ``PROMPT_CHARS`` characters."""
    if path in _CHAT_PATHS:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        head: list = []
        for message in messages:
            head.append(message)
            if isinstance(message, dict) and message.get("role") == "user":
                break
        return _digest({"system": data.get("system"), "messages": head})
    if path in _PROMPT_PATHS:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return _digest(prompt[:PROMPT_CHARS]) if prompt else None
        return _digest(prompt) if isinstance(prompt, list) and prompt else None  # token ids
    return None


def estimate_tokens(body_bytes: int, data: dict) -> int:
    """A request's work in tokens, roughly: its body's bytes / 4 for the prompt, plus what it may generate."""
    limit = data.get("max_completion_tokens", data.get("max_tokens"))
    return body_bytes // 4 + (limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else 0)


class AffinityTable:
    """Conversation key → the member that answered it last: a bounded LRU with a time to live."""

    def __init__(self, capacity: int = AFFINITY_KEYS, ttl_s: float = AFFINITY_TTL_S):
        self.capacity, self.ttl_s = capacity, ttl_s
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> str | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if now - found[1] > self.ttl_s:
            del self._entries[key]
            return None
        return found[0]

    def put(self, key: str, member: str, now: float) -> None:
        self._entries[key] = (member, now)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


@dataclass(frozen=True)
class Member:
    """A candidate as the balancer sees it: its place in the set, its load, whether it is ejected."""

    route: Route
    index: int
    outstanding: int = 0
    est_tokens: int = 0
    ejected: bool = False

    @property
    def name(self) -> str:
        return self.route.name


def order(members: Sequence[Member], preferred: str | None = None, turn: int = 0) -> list[Member]:
    """The order to try ``members`` in: least outstanding, then fewest tokens in flight, then
    round-robin from ``turn``; ejected members last; the ``preferred`` member (the conversation's)
    first while it is not ejected and within ``AFFINITY_SLACK`` of the least loaded."""
    if not members:
        return []
    n = max(m.index for m in members) + 1
    ranked = sorted(members, key=lambda m: (m.ejected, m.outstanding, m.est_tokens, (m.index - turn) % n))
    if preferred is not None:
        live = [m for m in ranked if not m.ejected]
        least = min((m.outstanding for m in live), default=0)
        chosen = next((m for m in live if m.name == preferred), None)
        if chosen is not None and chosen.outstanding <= least + AFFINITY_SLACK:
            ranked.remove(chosen)
            ranked.insert(0, chosen)
    return ranked


def candidate(route: Route) -> bool:
    """May a set send this member a request now (before any try): a local one the daemon shows
    serving, an upstream its health checks do not show unreachable."""
    return serving(route) and route.state != "unreachable"


@dataclass
class Replicas:
    """The gateway's view of its members' load: requests and estimated tokens in flight per entry,
    ejections, the conversations' affinity, each set's round-robin turn. Written on the event loop only."""

    outstanding: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    ejected_until: dict[str, float] = field(default_factory=dict)
    affinity: AffinityTable = field(default_factory=AffinityTable)
    turns: dict[str, int] = field(default_factory=dict)

    def begin(self, entry: str, est_tokens: int) -> None:
        self.outstanding[entry] = self.outstanding.get(entry, 0) + 1
        self.tokens[entry] = self.tokens.get(entry, 0) + est_tokens

    def end(self, entry: str, est_tokens: int) -> None:
        self.outstanding[entry] = max(0, self.outstanding.get(entry, 0) - 1)
        self.tokens[entry] = max(0, self.tokens.get(entry, 0) - est_tokens)

    def eject(self, entry: str, now: float) -> None:
        self.ejected_until[entry] = now + EJECT_S

    def is_ejected(self, entry: str, now: float) -> bool:
        until = self.ejected_until.get(entry)
        if until is not None and until <= now:
            del self.ejected_until[entry]
            return False
        return until is not None

    def ejected(self, now: float) -> frozenset[str]:
        return frozenset(e for e in list(self.ejected_until) if self.is_ejected(e, now))

    def members(self, rset: ReplicaSet, now: float) -> list[Member]:
        """The set's candidates with their load (members not serving are left out)."""
        return [
            Member(r, i, self.outstanding.get(r.name, 0), self.tokens.get(r.name, 0), self.is_ejected(r.name, now))
            for i, r in enumerate(rset.members)
            if candidate(r)
        ]

    def plan(self, rset: ReplicaSet, key: str | None, now: float) -> list[Route]:
        """The members to try for one request, in order (each once)."""
        turn = self.turns.get(rset.name, 0)
        self.turns[rset.name] = turn + 1
        preferred = self.affinity.get(rset.name + "\0" + key, now) if key is not None else None
        return [m.route for m in order(self.members(rset, now), preferred, turn)]

    def answered(self, rset: ReplicaSet, key: str | None, entry: str, now: float) -> None:
        """``entry`` answered the conversation ``key``: its next turn goes there first."""
        if key is not None:
            self.affinity.put(rset.name + "\0" + key, entry, now)

    def swapped(self, old: Table, new: Table) -> None:
        """A push showing a member serving again (it was not) ends its ejection at once."""
        before = {r.name: serving(r) for r in old.routes}
        for route in new.routes:
            if serving(route) and before.get(route.name) is False:
                self.ejected_until.pop(route.name, None)


def fallback(rset: ReplicaSet) -> Route | None:
    """With no member serving: the member to send the request to as a single route would be sent
    (the first lazy member that can be loaded, else the first on its way to ready), or None."""
    lazy = [r for r in rset.members if r.kind == "local" and r.load == "lazy" and r.state in LAZY_HEALTHY_STATES]
    return next(iter(lazy), None) or next((r for r in rset.members if coming_up(r)), None)
