"""The real daemon supervising real workers on builtin:tiny: hot reload, crash
recovery, shutdown, and vllmmlxctl against it.

A change that must swap in a new worker edits ``prefill_step_size`` (read when a worker
starts); ``default_temperature`` and the other live keys are pushed to the running worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.daemon import free_port, model_entry, pid_alive, wait_gone
from tests.support.servers import version_fields

pytestmark = pytest.mark.timeout(600)


def _logged_within(daemon, offset: int, needle: str, seconds: float) -> float:
    """Seconds until ``needle`` appears in the daemon's log past ``offset``; fails past ``seconds``."""
    started = time.monotonic()
    while needle not in daemon.log()[offset:]:
        took = time.monotonic() - started
        assert took < seconds, f"{needle!r} not logged within {seconds}s:\n{daemon.log()[-3000:]}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_edits_add_change_and_remove_entries_and_vllmmlxctl_drives_it(daemon):
    pa, pb = free_port(), free_port()
    daemon.write({"a": model_entry(pa, served_model_name="Alpha")})
    daemon.start()
    daemon.wait_ready({"a"})

    # status: table, json, exit 0 when all ready
    table = daemon.ctl("status")
    assert table.returncode == 0, table.stderr
    assert table.stdout.split()[:7] == ["MODEL", "STATE", "PID", "PORT", "KEYS", "UPTIME", "RESTARTS"]
    assert "a" in table.stdout and "ready" in table.stdout
    js = json.loads(daemon.ctl("status", "--json").stdout)
    assert set(js["daemon"]) >= {"pid", "uptime_s", "config_path", "config_hash", "last_reload"}
    assert set(js["models"][0]) >= {
        "name",
        "state",
        "pid",
        "host",
        "port",
        "restarts",
        "uptime_s",
        "last_exit_code",
        "served_model_name",
    }
    assert js["daemon"]["pid"] == daemon.proc.pid and js["models"][0]["served_model_name"] == "Alpha"
    assert httpx.get(f"http://127.0.0.1:{pa}/health").json() == {"status": "ok", "model": "Alpha", **version_fields()}

    # add b by editing the file: the reload starts within 5 s (then the worker loads, as long as it takes)
    offset = len(daemon.log())
    daemon.write({"a": model_entry(pa, served_model_name="Alpha"), "b": model_entry(pb)})
    _logged_within(daemon, offset, "event=worker.spawned model=b", 5)
    daemon.wait_ready({"a", "b"}, timeout=60)
    assert httpx.get(f"http://127.0.0.1:{pb}/health").json()["model"] == "b"

    # change a, remove b: both under way within 5 s
    a_pid = daemon.models()["a"]["pid"]
    offset = len(daemon.log())
    daemon.write({"a": model_entry(pa, served_model_name="Alpha", prefill_step_size=128)})
    _logged_within(daemon, offset, "event=worker.spawned model=a", 5)
    daemon.wait_for(lambda ms: set(ms) == {"a"} and ms["a"]["pid"] != a_pid and ms["a"]["state"] == "ready", 60, "swap")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{pb}/health")
    assert daemon.status()["daemon"]["last_reload"]["ok"] is True

    # reload with nothing changed is a no-op that succeeds
    r = daemon.ctl("reload")
    assert r.returncode == 0 and "no changes" in r.stdout

    # restart one model: new pid, still serving
    pid = daemon.models()["a"]["pid"]
    r = daemon.ctl("restart", "a")
    assert r.returncode == 0, r.stdout + r.stderr
    assert daemon.models()["a"]["pid"] != pid and daemon.models()["a"]["state"] == "ready"
    assert daemon.ctl("restart", "nope").returncode == 1

    # logs: the worker's lines, tagged with its model
    logs = daemon.ctl("logs", "a", "-n", "50")
    assert logs.returncode == 0 and "event=worker.listening" in logs.stdout and "model=a" in logs.stdout

    # stop and start one model
    assert daemon.ctl("stop", "a").returncode == 0
    assert daemon.models()["a"]["state"] == "stopped"
    assert daemon.ctl("status").returncode == 3  # some model not ready
    assert daemon.ctl("start", "a").returncode == 0
    assert daemon.models()["a"]["state"] == "ready"


def test_killed_worker_comes_back(daemon):
    pa = free_port()
    daemon.write({"a": model_entry(pa)})
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    os.kill(pid, signal.SIGKILL)
    daemon.wait_for(lambda ms: ms["a"]["pid"] not in (None, pid) and ms["a"]["state"] == "ready", 60, "restart")
    m = daemon.models()["a"]
    assert m["restarts"] == 1 and m["last_exit_code"] == -9


def test_sigterm_exits_zero_and_leaves_no_worker(daemon):
    daemon.write({"a": model_entry(free_port()), "b": model_entry(free_port())})
    daemon.start()
    daemon.wait_ready({"a", "b"})
    pids = daemon.worker_pids()
    assert len(pids) == 2
    assert daemon.stop() == 0
    assert wait_gone(pids, 5), [p for p in pids if pid_alive(p)]
    assert "event=daemon.stopped" in daemon.log()


def test_kill_9_of_the_daemon_leaves_no_worker(daemon):
    daemon.write({"a": model_entry(free_port())})
    daemon.start()
    daemon.wait_ready({"a"})
    pids = daemon.worker_pids()
    daemon.proc.kill()
    daemon.proc.wait()
    assert wait_gone(pids, 20), "worker outlived the daemon"


def test_invalid_config_at_startup_exits_78(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models:\n  a:\n    model: builtin:tiny\n    port: nope\n")
    r = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.cli", "run", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 78
    assert "bad.yaml:4:11" in r.stderr and "event=config.invalid" in r.stderr


def test_check_validates_without_a_daemon(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("models:\n  a:\n    model: builtin:tiny\n")
    bad.write_text("models:\n  a:\n    modle: builtin:tiny\n")

    def run(f):
        return subprocess.run([sys.executable, "-m", "vllmmlxd.ctl", "check", str(f)], capture_output=True, text=True)

    assert run(good).returncode == 0
    r = run(bad)
    assert r.returncode == 1 and "bad.yaml:3:5" in (r.stdout + r.stderr)


def test_ctl_reports_an_unreachable_daemon(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.ctl", "--socket", str(tmp_path / "none.sock"), "status"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 4 and "cannot reach the daemon" in r.stderr


def test_status_shows_each_models_load_and_cache(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port, cache_memory_mb=64)})
    daemon.start()
    daemon.wait_ready({"a"})
    url = f"http://127.0.0.1:{port}/v1/completions"
    assert httpx.post(url, json={"prompt": "Once upon a time " * 20, "max_tokens": 4}).status_code == 200
    body = {"prompt": "x", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(30):  # some tokens out, so the recent rate has something to measure
            next(lines)
        a = daemon.models()["a"]
        assert (a["running"], a["waiting"]) == (1, 0)
        assert a["tokens_per_s"] > 0
        assert a["cache_budget_mb"] == 64.0 and 0 < a["cache_mb"] <= 64.0
        row = dict(zip(*(line.split() for line in daemon.ctl("status").stdout.splitlines()[:2])))
        assert row["RUN"] == "1" and row["CACHE"] == f"{a['cache_mb']:g}/64M"
