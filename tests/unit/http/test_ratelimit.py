"""Request and token limits per caller and per key, their headers, and the bounded store."""

from __future__ import annotations

import time

import pytest
from limits import RateLimitItemPerMinute

from vllmmlxd.config.gateway import GroupLimits
from vllmmlxd.config.keys import KeyGrant
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.errors import ConfigError, RateLimited
from vllmmlxd.http.access import Caller
from vllmmlxd.http.ratelimit import GroupQuotas, Quotas, RateStore, format_reset, rate_items


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "time", c)  # limits' MemoryStorage and the quotas both read time.time
    return c


def quotas(**entry) -> Quotas:
    return Quotas(ResolvedModel(model="builtin:tiny", **entry), RateStore())


ADDR = Caller(identity="addr:10.0.0.7")


def test_n_requests_then_a_429_with_retry_after_and_headers(clock):
    q = quotas(rate_limit=3)
    seen = [q.admit(ADDR)["x-ratelimit-remaining-requests"] for _ in range(3)]
    assert seen == ["2", "1", "0"]
    clock.now += 20
    with pytest.raises(RateLimited) as info:
        q.admit(ADDR)
    assert info.value.retry_after == 40 and info.value.headers["Retry-After"] == "40"
    assert info.value.headers["x-ratelimit-limit-requests"] == "3"
    assert info.value.headers["x-ratelimit-reset-requests"] == "40s"
    assert "3 requests per minute" in info.value.message
    clock.now += 41  # a moving window: the first hits have left it
    assert q.admit(ADDR)["x-ratelimit-remaining-requests"] == "2"


def test_clients_have_their_own_budgets_and_zero_is_no_limit(clock):
    q = quotas(rate_limit="1/second")
    q.admit(ADDR)
    q.admit(Caller(identity="addr:10.0.0.8"))
    with pytest.raises(RateLimited):
        q.admit(ADDR)
    assert quotas(rate_limit=0).admit(ADDR) == {}


def test_a_key_counts_its_own_limits_beside_the_models(clock):
    config = parse_config("""
api_keys:
  ci: {key: s, rate_limit: "2/minute", tokens_per_minute: 100}
models:
  m: {model: builtin:tiny, api_keys: [ci], rate_limit: 10}
""").config.models["m"]
    q = Quotas(config, RateStore())
    ci = Caller(identity="key:ci", key=config.key_grants[0])
    first = q.admit(ci)
    # The tightest window speaks for each kind: the key's 2/minute, not the model's 10.
    assert (first["x-ratelimit-limit-requests"], first["x-ratelimit-remaining-requests"]) == ("2", "1")
    assert (first["x-ratelimit-limit-tokens"], first["x-ratelimit-remaining-tokens"]) == ("100", "100")
    q.charge(ci, 150)  # more than is left: the window is spent to zero, not skipped
    with pytest.raises(RateLimited, match="100 generated tokens per minute reached for key 'ci'") as info:
        q.admit(ci)
    assert info.value.headers["x-ratelimit-remaining-tokens"] == "0"
    clock.now += 61
    assert q.admit(ci)["x-ratelimit-remaining-tokens"] == "100"


def test_an_unchanged_limit_keeps_its_budget_across_settings_and_a_new_one_starts_fresh(clock):
    store = RateStore()
    Quotas(ResolvedModel(model="x", rate_limit=2), store).admit(ADDR)
    Quotas(ResolvedModel(model="x", rate_limit=2), store).admit(ADDR)
    with pytest.raises(RateLimited):
        Quotas(ResolvedModel(model="x", rate_limit=2, timeout=5), store).admit(ADDR)
    assert Quotas(ResolvedModel(model="x", rate_limit=3), store).admit(ADDR)["x-ratelimit-remaining-requests"] == "2"


def test_the_store_forgets_the_least_recent_clients_past_its_bound(clock):
    store = RateStore(max_tracked=100)
    q = Quotas(ResolvedModel(model="x", rate_limit=1), store)
    for i in range(1000):
        q.admit(Caller(identity=f"addr:10.0.{i // 250}.{i % 250}"))
    assert store.tracked == 100
    assert len(store.limiter.storage.events) <= 100  # the windows themselves are dropped too


def test_a_forgotten_window_waits_for_the_storage_s_expiry_thread_to_let_go_of_it():
    # limits' memory storage expires events on a thread of its own under a per-key lock, and its
    # clear takes none: dropping a window mid-expiry killed that thread with a KeyError (issue 37).
    import threading

    class Watched:
        """The key's lock, noting each thread that asks for it."""

        def __init__(self) -> None:
            self.lock = threading.RLock()
            self.askers: list[threading.Thread] = []

        def __enter__(self) -> None:
            self.askers.append(threading.current_thread())
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    store = RateStore(max_tracked=1)
    item = RateLimitItemPerMinute(5)
    store.limiter.hit(item, "a")
    store.touch("a", [item])
    key = item.key_for("a")
    expiring = store.storage.locks[key] = Watched()
    expiring.lock.acquire()  # the expiry thread, inside its section for this key
    forgetting = threading.Thread(target=store.touch, args=("b", [item]))  # past the bound: "a" goes
    forgetting.start()
    deadline = time.monotonic() + 10
    while forgetting not in expiring.askers and forgetting.is_alive():  # until it waits for the lock, or is done
        assert time.monotonic() < deadline, "never asked for the key's lock"
        time.sleep(0.01)
    assert forgetting.is_alive() and key in store.storage.events, (
        "the window was dropped under the expiry thread's feet"
    )
    expiring.lock.release()
    forgetting.join(5)
    assert not forgetting.is_alive() and key not in store.storage.events


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (0.2, "1s"), (59, "59s"), (65, "1m5s"), (7203, "2h0m3s")])
def test_reset_times_read_as_openai_writes_them(seconds, text):
    assert format_reset(seconds) == text


def test_rate_text_becomes_limits_items():
    assert rate_items(60) == (RateLimitItemPerMinute(60),)
    assert [str(i) for i in rate_items("5/second;100/hour")] == ["5 per 1 second", "100 per 1 hour"]
    assert rate_items(0) == ()


def test_a_replica_sets_windows_are_counted_per_client_and_per_key_for_the_whole_set(clock):
    store = RateStore()
    alice = Caller(identity="key:alice", key=KeyGrant(name="alice", sha256="0" * 64, allowed=True, rate_limit=2))
    both = GroupQuotas("tiny", GroupLimits(rate_limit=3), store)
    for _ in range(2):
        both.admit(alice)
    with pytest.raises(RateLimited, match="2 requests per minute reached for key 'alice'"):
        both.admit(alice)  # the key's own limit, for the set as a whole
    for _ in range(3):
        both.admit(ADDR)
    with pytest.raises(RateLimited, match="3 requests per minute reached for this client"):
        both.admit(ADDR)
    clients_only = GroupQuotas("other", GroupLimits(rate_limit=5, key_limits=False), store)
    for _ in range(5):
        clients_only.admit(alice)  # another set, its own windows; the key's limit not counted here
    with pytest.raises(RateLimited):
        clients_only.admit(alice)


def test_gateway_groups_must_name_groups_of_the_models():
    text = """
gateway: {port: 8080}
models:
  a: {model: builtin:tiny, port: 8001, group: tiny}
  b: {model: builtin:tiny, port: 8002, group: tiny}
"""
    ok = parse_config(text.replace("{port: 8080}", "{port: 8080, groups: {tiny: {rate_limit: '10/minute'}}}"), "c")
    assert ok.config.gateway.groups["tiny"].rate_limit == "10/minute"
    with pytest.raises(ConfigError, match=r"gateway.groups has 1 name"):
        parse_config(text.replace("{port: 8080}", "{port: 8080, groups: {tinny: {}}}"), "c")
