"""Lazy models on the real daemon: unloaded until needed, loaded on demand, unloaded when idle and
on time with nobody watching, and an idle unload meeting a reload. Which idle model makes room
for another is decided in tests/unit/supervisor (test_plan, test_supervisor); the gateway's e2e
tests keep one such eviction on the real daemon."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
import yaml

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone

pytestmark = pytest.mark.timeout(300)
FAST = {"VLLMMLXD_HEALTH_INTERVAL_S": "1"}


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
    code = d.stop()
    assert wait_gone(pids)
    if code not in (0, None):
        pytest.fail(f"daemon exited {code}:\n{d.log()[-3000:]}")


def write(d, models: dict, **daemon) -> None:
    body = {
        "daemon": {"control_socket": str(d.socket), "state_dir": str(d.state_dir), "drain_timeout": 5, **daemon},
        "models": models,
    }
    d.write_text(yaml.safe_dump(body, sort_keys=False))


def state(d, name: str) -> str:
    return d.models()[name]["state"]


def test_a_lazy_model_loads_on_demand_and_unloads_when_idle(daemon):
    d = daemon
    a, b = free_port(), free_port()
    write(
        d,
        {
            "a": model_entry(a, cache_memory_mb=64),
            "b": model_entry(b, cache_memory_mb=64, load="lazy", idle_unload_s=3),
        },
    )
    d.start(env=FAST)
    d.wait_for(lambda ms: ms["a"]["state"] == "ready" and ms["b"]["state"] == "unloaded", what="a ready, b unloaded")
    assert d.models()["b"]["pid"] is None and d.models()["b"]["load"] == "lazy"
    assert d.ctl("status").returncode == 0  # an unloaded lazy model is not a fault
    # A request on its own port is answered at once, saying why (the gateway reads the state header),
    # and loads it: the SDK's retry after Retry-After finds it ready.
    r = httpx.get(f"http://127.0.0.1:{b}/v1/models", timeout=5)
    assert r.status_code == 503 and r.headers["x-vllmmlxd-state"] == "unloaded" and r.headers["retry-after"] == "5"
    assert "it is loading now" in r.json()["error"]["message"]
    d.wait_for(lambda ms: ms["b"]["state"] in ("idle", "ready"), timeout=60, what="b loaded on demand")
    assert "event=model.demanded model=b" in d.log()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{b}/v1", api_key="x", max_retries=0, timeout=60)
    assert client.completions.create(model="b", prompt="hi", max_tokens=4).choices
    d.wait_for(lambda ms: ms["b"]["state"] == "idle", timeout=10, what="b idle")
    assert "idle" in d.ctl("status").stdout
    took = d.wait_for(lambda ms: ms["b"]["state"] == "unloaded", timeout=20, what="b unloaded when idle")
    assert took < 10
    unloading = [line for line in d.log().splitlines() if "event=model.unloading" in line]
    assert len(unloading) == 1 and "model=b" in unloading[0] and "reason=idle" in unloading[0]
    assert float(re.search(r"idle_s=([\d.]+)", unloading[0])[1]) >= 3
    assert state(d, "a") == "ready"  # an eager model is never unloaded
    # Loaded again on the next demand: an SDK client that retries (as they do by default) gets its answer.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{b}/v1", api_key="x", max_retries=3, timeout=60)
    assert client.completions.create(model="b", prompt="hi", max_tokens=4).choices
    # Stopped on purpose: a request does not load it.
    assert d.ctl("stop", "b").returncode == 0
    demanded = d.log().count("event=model.demanded model=b")
    r = httpx.get(f"http://127.0.0.1:{b}/v1/models", timeout=5)
    assert r.status_code == 503 and r.headers["x-vllmmlxd-state"] == "stopped"
    # The supervisor takes its messages in order: a demand this answer made would be handled before
    # a reload asked for after it (a dry run: it changes nothing).
    assert d.ctl("reload", "--dry-run").returncode == 0
    assert state(d, "b") == "stopped" and d.log().count("event=model.demanded model=b") == demanded


def _wait_log(d, needle: str, timeout: float, after: int = 0) -> float:
    """Wait for ``needle`` in the daemon's log past offset ``after`` (no status call: nobody watches)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if needle in d.log()[after:]:
            return time.monotonic()
        assert d.proc.poll() is None, d.log()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{d.log()[-3000:]}")


def _gateway_ready(d, timeout: float = 60) -> None:
    """Before the first request: the gateway's own port answers 503 while its process starts."""
    deadline = time.monotonic() + timeout
    while (d.status() or {}).get("gateway", {}).get("state") != "ready":
        assert time.monotonic() < deadline, f"the gateway did not become ready:\n{d.log()[-3000:]}"
        time.sleep(0.1)


def _stream_for(client, seconds: float) -> None:
    """Stream answers back to back for at least ``seconds``: one request busy across several idle checks."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        stream = client.chat.completions.create(
            model="b",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=400,
            seed=1,
            extra_body={"ignore_eos": True},
        )
        assert sum(1 for _ in stream) > 0


def test_an_idle_unload_happens_on_time_after_a_long_stream_with_nobody_watching(daemon):
    """Found by outside checks: a lazy model stayed loaded minutes past idle_unload_s until someone asked
    for status (the routine health check did not refresh its idle time). No status call here."""
    d = daemon
    port, gateway = free_port(), free_port()
    d.write(
        {"b": model_entry(port, cache_memory_mb=64, load="lazy", idle_unload_s=2)},
        daemon={"drain_timeout": 5},
        gateway={"port": gateway, "load_timeout": 120},
    )
    d.start(env=FAST)
    d.wait_for(lambda ms: ms["b"]["state"] == "unloaded", what="b unloaded")
    _gateway_ready(d)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway}/v1", api_key="x", max_retries=0, timeout=120)
    _stream_for(client, 5.0)  # longer than idle_unload_s, so idle checks find it busy
    ended, offset = time.monotonic(), len(d.log())
    assert "event=model.unloading" not in d.log()  # never while a request ran
    unloaded = _wait_log(d, "event=model.unloading model=b reason=idle", timeout=30, after=offset)
    assert unloaded - ended < 2 + 2.5, f"unloaded {unloaded - ended:.1f}s after the last request"


def test_an_idle_unload_and_a_reload_of_the_same_model_at_once(daemon):
    """The idle unloader and a reload's swap of one lazy model meet: requests keep succeeding through the
    gateway, and the model ends in one state with the new entry (the decisions: test_plan, test_supervisor)."""
    import concurrent.futures

    d = daemon
    port, gateway = free_port(), free_port()
    entry = model_entry(port, cache_memory_mb=64, load="lazy", idle_unload_s=2)
    d.write({"b": entry}, daemon={"drain_timeout": 5}, gateway={"port": gateway, "load_timeout": 120})
    d.start(env=FAST)
    d.wait_for(lambda ms: ms["b"]["state"] == "unloaded", what="b unloaded")
    _gateway_ready(d)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway}/v1", api_key="x", max_retries=0, timeout=120)
    assert client.completions.create(model="b", prompt="hi", max_tokens=2).choices
    offset = len(d.log())
    _wait_log(d, "event=model.unloading model=b reason=idle", timeout=30, after=offset)
    d.write(
        {"b": {**entry, "max_num_seqs": 4}},
        daemon={"drain_timeout": 5},  # a key that needs a new worker
        gateway={"port": gateway, "load_timeout": 120},
    )
    reload = d.ctl("reload")

    def ask(i: int) -> str:
        return client.completions.create(model="b", prompt=f"hi {i}", max_tokens=2, seed=i).choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, range(6)))
    assert reload.returncode == 0, reload.stdout + reload.stderr
    assert all(a in ("stop", "length") for a in answers)
    assert "slot.illegal_transition" not in d.log() and "supervisor.error" not in d.log()
    ms = d.models()
    assert ms["b"]["state"] in ("ready", "idle", "unloaded") and d.status()["daemon"]["last_reload"]["ok"]
    assert (ms["b"]["pid"] is None) == (ms["b"]["state"] == "unloaded")
