"""Reloads on the real daemon: edits picked up by the watcher or asked for (ctl, SIGHUP), an
unaffected model serving through them, an invalid edit changing nothing, a burst of saves."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.support.daemon import free_port, model_entry
from tests.support.load import SteadyLoad

pytestmark = pytest.mark.timeout(600)


def test_unaffected_model_serves_through_reloads_and_changed_model_swaps_without_failures(daemon):
    pa, pb = free_port(), free_port()
    daemon.write({"a": model_entry(pa), "b": model_entry(pb, prefill_step_size=256)})
    daemon.start()
    daemon.wait_ready({"a", "b"})
    # b, the swapped model, is called over pooled keep-alive connections, as SDKs do
    with SteadyLoad(pa) as load_a, SteadyLoad(pb, keepalive=True) as load_b:
        for i in range(2):  # a swap under load, then a swap of the worker a swap started; more repeat the path
            before = daemon.models()["b"]["pid"]
            daemon.write({"a": model_entry(pa), "b": model_entry(pb, prefill_step_size=300 + i)})
            daemon.wait_for(
                lambda ms, before=before: ms["b"]["pid"] != before and ms["b"]["state"] == "ready", 60, f"reload {i}"
            )
        # Both keep being served past the last swap (b's pooled connections were to the old worker).
        served = load_a.ok, load_b.ok
        deadline = time.monotonic() + 60
        while load_a.ok < served[0] + 3 or load_b.ok < served[1] + 3:
            assert time.monotonic() < deadline, (load_a.failures[:5], load_b.failures[:5])
            time.sleep(0.05)
    assert load_a.failures == [] and load_a.ok > 20, load_a.failures[:5]
    assert load_b.failures == [] and load_b.ok > 20, load_b.failures[:5]
    assert daemon.models()["a"]["restarts"] == 0


def test_invalid_edit_keeps_serving_and_is_reported(daemon):
    pa = free_port()
    daemon.write({"a": model_entry(pa)})
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    daemon.write_text(f"models:\n  a:\n    model: builtin:tiny\n    port: {pa}\n    prot: 1\n")
    daemon.wait_for(lambda ms: True, 5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (daemon.status()["daemon"]["last_reload"] or {}).get("ok") is not False:
        time.sleep(0.1)
    last = daemon.status()["daemon"]["last_reload"]
    assert last["ok"] is False and "config.yaml:5:5" in last["error"] and "did you mean 'port'" in last["error"]
    assert daemon.models()["a"]["pid"] == pid and daemon.models()["a"]["state"] == "ready"
    assert httpx.post(f"http://127.0.0.1:{pa}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    r = daemon.ctl("reload")
    assert r.returncode == 1 and "config.yaml:5:5" in (r.stdout + r.stderr)
    assert "FAILED" in daemon.ctl("status").stdout


def test_dry_run_then_reload_by_ctl_and_by_sighup_when_not_watching(daemon):
    pa = free_port()
    daemon.write({"a": model_entry(pa)}, daemon={"watch": False})
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    daemon.write({"a": model_entry(pa, prefill_step_size=200), "b": model_entry(free_port())}, daemon={"watch": False})
    dry = daemon.ctl("reload", "--dry-run")
    assert dry.returncode == 0 and "added: b" in dry.stdout and "changed: a (prefill_step_size)" in dry.stdout
    assert set(daemon.models()) == {"a"} and daemon.models()["a"]["pid"] == pid  # nothing applied
    r = daemon.ctl("reload")
    assert r.returncode == 0, r.stdout + r.stderr
    # Reloads run one after another: this one still had it all to do, so the dry run applied nothing, then or later.
    assert "added: b" in r.stdout and "changed: a (prefill_step_size)" in r.stdout, r.stdout
    assert daemon.models()["a"]["pid"] != pid and daemon.models()["b"]["state"] == "ready"
    # SIGHUP applies the file too
    daemon.write({"a": model_entry(pa, prefill_step_size=200)}, daemon={"watch": False})
    os.kill(daemon.proc.pid, signal.SIGHUP)
    daemon.wait_for(lambda ms: set(ms) == {"a"}, 30, "sighup reload")


def test_turning_watch_off_applies_on_reload(daemon):
    pa = free_port()
    daemon.write({"a": model_entry(pa)})
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    daemon.write({"a": model_entry(pa, prefill_step_size=300)}, daemon={"watch": False, "log_level": "debug"})
    daemon.wait_for(lambda ms: ms["a"]["pid"] != pid and ms["a"]["state"] == "ready", 30, "watched reload")
    pid = daemon.models()["a"]["pid"]
    daemon.write({"a": model_entry(pa, prefill_step_size=400)}, daemon={"watch": False, "log_level": "debug"})
    time.sleep(1.5)
    assert daemon.models()["a"]["pid"] == pid  # no longer watching
    assert "changed: a (prefill_step_size)" in daemon.ctl("reload", "--dry-run").stdout
