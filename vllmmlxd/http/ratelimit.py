"""Request and token limits per client, per model and per named key, with ``limits``' moving window.

A model entry's ``rate_limit`` / ``tokens_per_minute`` count per caller (its key's name, else
its address); a named key's own limits count for that key. A request must fit every request
limit that applies and find some budget left in every token limit; its generated tokens are
charged when it ends. Clients see ``x-ratelimit-*`` headers (the tightest limit of each kind)
on every answer, and a 429 with ``Retry-After`` when over.

The counts live in one ``RateStore`` per worker, kept across settings pushes: an unchanged
limit keeps its budget, a changed one starts fresh (its window key differs). The store
forgets the least recently seen client beyond a bound, so many addresses cannot grow it.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from limits import RateLimitItem, RateLimitItemPerMinute, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from starlette.types import Scope

from ..config.gateway import GroupLimits
from ..config.schema import ResolvedModel
from ..errors import RateLimited
from .access import Caller
from .response_headers import Headers, ResponseHeaders

MAX_TRACKED = 10_000  # clients (keys or addresses) whose windows are kept at once
STATE_KEY = "ratelimit_headers"  # where a request's headers wait for its response


def rate_items(value: int | str) -> tuple[RateLimitItem, ...]:
    """A config rate (an int per minute, or text like ``5/second;100/hour``) as ``limits`` items."""
    if isinstance(value, int):
        return (RateLimitItemPerMinute(value),) if value > 0 else ()
    return tuple(parse_many(value))


def token_items(per_minute: int) -> tuple[RateLimitItem, ...]:
    return (RateLimitItemPerMinute(per_minute),) if per_minute > 0 else ()


class RateStore:
    """The moving windows of one worker, bounded to ``max_tracked`` clients (least recent forgotten)."""

    def __init__(self, max_tracked: int = MAX_TRACKED):
        self.storage = MemoryStorage()
        self.limiter = MovingWindowRateLimiter(self.storage)
        self.max_tracked = max_tracked
        self._seen: OrderedDict[str, set[RateLimitItem]] = OrderedDict()

    def touch(self, identity: str, items: Iterable[RateLimitItem]) -> None:
        """Note that ``identity`` uses ``items``; forget the least recent identities past the bound."""
        used = self._seen.pop(identity, set())
        used.update(items)
        self._seen[identity] = used
        while len(self._seen) > self.max_tracked:
            old, old_items = self._seen.popitem(last=False)
            for item in old_items:
                self._forget(item.key_for(old))

    def _forget(self, key: str) -> None:
        """Drop one window, under the key's lock: ``limits``' memory storage expires events on a
        thread of its own, holding that lock, and its ``clear`` takes none (5.8: the expiry read a
        window another thread had just dropped, and its thread died on a KeyError)."""
        with self.storage.locks[key]:
            self.storage.clear(key)

    @property
    def tracked(self) -> int:
        return len(self._seen)


@dataclass(frozen=True)
class _Limit:
    """One window counted under one identity."""

    item: RateLimitItem
    identity: str

    def stats(self, store: RateStore) -> tuple[int, float]:
        """(remaining, seconds until the oldest hit leaves the window)."""
        reset, remaining = store.limiter.get_window_stats(self.item, self.identity)
        return remaining, max(0.0, reset - time.time())


class Quotas:
    """The limits of one settings generation over the worker's ``RateStore``."""

    def __init__(self, config: ResolvedModel, store: RateStore):
        self.store = store
        self._model_requests = rate_items(config.rate_limit)
        self._model_tokens = token_items(config.tokens_per_minute)

    def limits(self, caller: Caller) -> tuple[list[_Limit], list[_Limit]]:
        """The (request, token) windows that apply to ``caller``."""
        requests = [_Limit(i, "model|" + caller.identity) for i in self._model_requests]
        tokens = [_Limit(i, "model|" + caller.identity) for i in self._model_tokens]
        if caller.key is not None:
            requests += [_Limit(i, "key|" + caller.key.name) for i in rate_items(caller.key.rate_limit)]
            tokens += [_Limit(i, "key|" + caller.key.name) for i in token_items(caller.key.tokens_per_minute)]
        return requests, tokens

    def admit(self, caller: Caller) -> dict[str, str]:
        """Spend one request of ``caller``; its ``x-ratelimit-*`` headers, or ``RateLimited``."""
        requests, tokens = self.limits(caller)
        for limit in requests + tokens:
            self.store.touch(limit.identity, (limit.item,))
        blocked = [w for w in requests if not self.store.limiter.test(w.item, w.identity)]
        spent = [w for w in tokens if not self.store.limiter.test(w.item, w.identity)]
        if blocked or spent:
            headers = self._headers(requests, tokens)
            wait = max(w.stats(self.store)[1] for w in blocked + spent)
            retry_after = max(1, math.ceil(wait))
            what = (
                f"{blocked[0].item.amount} requests per {_period(blocked[0].item)}"
                if blocked
                else f"{spent[0].item.amount} generated tokens per {_period(spent[0].item)}"
            )
            who = f"key {caller.key_name!r}" if caller.key_name else "this client"
            raise RateLimited(
                f"rate limit of {what} reached for {who}; retry in {retry_after} s",
                retry_after=retry_after,
                headers={**headers, "Retry-After": str(retry_after)},
            )
        for limit in requests:
            self.store.limiter.hit(limit.item, limit.identity)
        return self._headers(requests, tokens)

    def charge(self, caller: Caller, generated: int) -> None:
        """Count ``generated`` tokens against ``caller``'s token windows (a window already short of
        them is spent to zero: the tokens were produced anyway)."""
        if generated <= 0:
            return
        for limit in self.limits(caller)[1]:
            if not self.store.limiter.hit(limit.item, limit.identity, cost=generated):
                remaining = limit.stats(self.store)[0]
                if remaining > 0:
                    self.store.limiter.hit(limit.item, limit.identity, cost=remaining)

    def _headers(self, requests: list[_Limit], tokens: list[_Limit]) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, limits in (("requests", requests), ("tokens", tokens)):
            if not limits:
                continue
            # The tightest window speaks for the kind: the one with the fewest left.
            remaining, reset, limit = min((*w.stats(self.store), w) for w in limits)
            headers[f"x-ratelimit-limit-{kind}"] = str(limit.item.amount)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, remaining))
            headers[f"x-ratelimit-reset-{kind}"] = format_reset(reset)
        return headers


class GroupQuotas(Quotas):
    """A replica set's request windows, counted by the gateway for the set as a whole: per client, and
    (``key_limits``) each named key's own ``rate_limit``. The members count their own windows too."""

    def __init__(self, group: str, limits: GroupLimits, store: RateStore):
        self.store = store
        self.group = group
        self._requests = rate_items(limits.rate_limit)
        self._keys = limits.key_limits

    def limits(self, caller: Caller) -> tuple[list[_Limit], list[_Limit]]:
        prefix = f"group|{self.group}|"
        requests = [_Limit(i, prefix + caller.identity) for i in self._requests]
        if self._keys and caller.key is not None:
            requests += [_Limit(i, prefix + "key|" + caller.key.name) for i in rate_items(caller.key.rate_limit)]
        return requests, []


def _period(item: RateLimitItem) -> str:
    return item.GRANULARITY.name if item.multiples == 1 else f"{item.multiples} {item.GRANULARITY.name}s"


def format_reset(seconds: float) -> str:
    """Time until a window frees, as OpenAI writes it: ``0s``, ``12s``, ``1m5s``, ``2h0m3s``."""
    s = math.ceil(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{sec}s"
    return f"{m}m{sec}s" if m else f"{sec}s"


class RateLimitHeaders(ResponseHeaders):
    """Puts the ``x-ratelimit-*`` headers a guarded request earned on its response (streamed too)."""

    def headers(self, scope: Scope, headers: Headers) -> Headers:
        extra = scope.get("state", {}).get(STATE_KEY)
        if not extra:
            return headers
        names = {k.lower() for k, _ in headers}
        return headers + [(k.encode(), v.encode()) for k, v in extra.items() if k.encode() not in names]
