"""The real daemon under faults: workers that fail, hang or crash-loop, signals in the middle
of a reload, ports traded between entries, a config file deleted, re-linked or hammered, and
a second daemon. Timings are shortened through the VLLMMLXD_* variables of supervisor/slot/tuning.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time

import httpx
import pytest
import yaml

from tests.support.daemon import free_port, make_daemon, model_entry, pid_alive, wait_gone

pytestmark = pytest.mark.timeout(300)

FAST = {"VLLMMLXD_BACKOFF_INITIAL_S": "0.1", "VLLMMLXD_MAX_FAST_CRASHES": "3"}


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    d.stop()
    assert wait_gone(spawned_pids(d), 20), "a worker outlived the daemon"


def spawned_pids(d) -> list[int]:
    return [int(p) for p in re.findall(r"event=worker\.spawned model=\S+ pid=(\d+)", d.log())]


def wait_log(d, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in d.log():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not logged in {timeout}s:\n{d.log()[-3000:]}")
        if d.proc.poll() is not None:
            raise RuntimeError(f"daemon exited {d.proc.returncode}:\n{d.log()[-3000:]}")
        time.sleep(0.05)


def test_a_model_that_cannot_load_fails_at_once_and_its_port_answers_503(daemon):
    port = free_port()
    daemon.write({"bad": {"model": str(daemon.dir / "no-such-model"), "port": port}})
    daemon.start(env=FAST)
    daemon.wait_for(lambda ms: ms["bad"]["state"] == "failed", 60, "bad failed")
    bad = daemon.models()["bad"]
    assert bad["restarts"] == 0 and bad["last_exit_code"] == 3  # no retries: loading again cannot help
    assert "could not be loaded" in bad["last_error"] and "no-such-model" in bad["last_error"]
    started = time.monotonic()
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": []}, timeout=5)
    assert time.monotonic() - started < 2
    assert r.status_code == 503 and r.headers["retry-after"] and r.headers["connection"] == "close"
    error = r.json()["error"]
    assert error["type"] == "overloaded_error" and error["message"].startswith("model bad failed: ")
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "failed"


def test_a_loading_model_answers_503_loading_then_serves(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port)})
    daemon.start()
    # Stopped as soon as it is spawned, read from the log (a status call takes long enough on a busy
    # machine for the worker to get as far as listening, and then no stand-in answers for it).
    wait_log(daemon, "event=worker.spawned model=a pid=")
    pid = spawned_pids(daemon)[0]
    os.kill(pid, signal.SIGSTOP)  # held in its load for as long as the test wants
    assert f"event=worker.listening model=a pid={pid}" not in daemon.log()
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x"}, timeout=5)
        assert r.status_code == 503 and "model a is loading" in r.json()["error"]["message"]
    finally:
        os.kill(pid, signal.SIGCONT)
    daemon.wait_ready({"a"}, 60)
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


def test_a_worker_that_never_becomes_ready_ends_failed_after_a_few_fast_crashes(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port)})
    daemon.start(env={**FAST, "VLLMMLXD_READY_TIMEOUT_S": "0.3"})
    daemon.wait_for(lambda ms: ms["a"]["state"] == "failed", 60, "a failed")
    a = daemon.models()["a"]
    assert a["restarts"] == 2 and a["last_exit_code"] == -9
    assert "crashed 3 times in a row" in a["last_error"] and "did not become ready within 0.3s" in a["last_error"]
    assert daemon.log().count("event=worker.backoff model=a") == 2
    r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    assert r.status_code == 503 and "crashed 3 times" in r.json()["error"]["message"]


def test_a_hung_worker_is_killed_and_replaced(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port)})
    env = {"VLLMMLXD_HEALTH_INTERVAL_S": "0.3", "VLLMMLXD_HEALTH_TIMEOUT_S": "0.5", "VLLMMLXD_HEALTH_FAILURES": "2"}
    daemon.start(env=env)
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    took = daemon.wait_for(lambda ms: ms["a"]["pid"] not in (None, pid) and ms["a"]["state"] == "ready", 60, "replaced")
    assert took < 30
    assert wait_gone([pid], 10)
    assert "event=worker.unhealthy model=a" in daemon.log() and daemon.models()["a"]["restarts"] == 1
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


def test_a_worker_whose_engine_stalls_is_killed_and_replaced(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port)})
    env = {
        "VLLMMLXD_HEALTH_INTERVAL_S": "0.3",
        "VLLMMLXD_HEALTH_FAILURES": "2",
        "VLLMMLXD_STUCK_AFTER_S": "1",
        "VLLMMLXD_TEST_STALL_ENGINE_S": "120",
    }  # worker/testing.py, worker/liveness.py
    daemon.start(env=env)
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]

    def ask() -> None:  # its first step stalls: /health turns degraded while this request waits
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    daemon.wait_for(lambda ms: ms["a"]["pid"] not in (None, pid) and ms["a"]["state"] == "ready", 60, "replaced")
    assert wait_gone([pid], 10) and "event=worker.unhealthy model=a" in daemon.log()
    asker.join(60)


def test_sigterm_in_the_middle_of_a_reload_exits_cleanly_with_no_worker_left(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port)}, daemon={"drain_timeout": 3})
    daemon.start()
    daemon.wait_ready({"a"})
    daemon.write(
        {"a": model_entry(port, prefill_step_size=128), "b": model_entry(free_port())}, daemon={"drain_timeout": 3}
    )
    wait_log(daemon, "event=worker.replacing model=a")  # the new worker is loading beside the old
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(3 + 10) == 0
    assert time.monotonic() - started < 3 + 10
    pids = spawned_pids(daemon)
    assert len(pids) >= 2 and wait_gone(pids, 5), [p for p in pids if pid_alive(p)]
    assert "event=daemon.stopped" in daemon.log()


def test_the_watchdog_is_fed_while_a_hung_worker_drains_at_shutdown(daemon):
    from tests.e2e.test_daemon_service import Datagrams

    notify = Datagrams(daemon.dir / "notify.sock")
    daemon.write({"a": model_entry(free_port())}, daemon={"drain_timeout": 1})
    daemon.start(env={"NOTIFY_SOCKET": str(daemon.dir / "notify.sock"), "WATCHDOG_USEC": "400000"})
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    os.kill(pid, signal.SIGSTOP)  # it cannot drain: the daemon waits drain_timeout + its margin, then kills it
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    notify.receive("STOPPING=1", 10)
    assert daemon.proc.wait(1 + 15) == 0
    took = time.monotonic() - started
    after = notify.got[notify._seen :]
    assert took > 3 and sum("WATCHDOG=1" in m for m in after) >= took / 0.2 / 3, (took, after)
    assert wait_gone([pid], 5)
    notify.close()


def test_sigterm_while_a_worker_starts_kills_it(daemon):
    daemon.write({"a": model_entry(free_port())})
    daemon.start()
    wait_log(daemon, "event=worker.spawned model=a")
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(15) == 0
    assert wait_gone(spawned_pids(daemon), 5)


def test_two_entries_exchange_ports_in_one_reload(daemon):
    pa, pb = free_port(), free_port()
    daemon.write({"a": model_entry(pa), "b": model_entry(pb)})
    daemon.start()
    daemon.wait_ready({"a", "b"})
    preview = daemon.dir / "preview.yaml"  # vllmmlxctl reload --dry-run FILE reads another file
    body = yaml.safe_load(daemon.config_path.read_text())
    body["models"] = {"a": model_entry(pb), "b": model_entry(pa)}
    preview.write_text(yaml.safe_dump(body))
    r = daemon.ctl("reload", "--dry-run", str(preview))
    assert r.returncode == 0 and f"would apply {preview}:" in r.stdout and "new worker  port" in r.stdout, (
        r.stdout + r.stderr
    )
    daemon.write({"a": model_entry(pb), "b": model_entry(pa)})
    daemon.wait_for(
        lambda ms: ms["a"]["port"] == pb and ms["b"]["port"] == pa and all(m["state"] == "ready" for m in ms.values()),
        60,
        "exchange",
    )
    assert daemon.status()["daemon"]["last_reload"]["ok"] is True
    assert httpx.get(f"http://127.0.0.1:{pa}/health", timeout=5).json()["model"] == "b"
    assert httpx.get(f"http://127.0.0.1:{pb}/health", timeout=5).json()["model"] == "a"


def test_a_config_deleted_or_relinked_keeps_serving_and_reloads_once(daemon):
    port = free_port()
    models = {"a": model_entry(port)}
    daemon.write(models)
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    original = daemon.config_path.read_text()

    daemon.config_path.unlink()  # deleted: reported, nothing stops
    daemon.wait_for(lambda ms: daemon.status()["daemon"]["config_missing"] is True, 20, "config_missing")
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    daemon.write_text(original)  # back as it was: no reload
    daemon.wait_for(lambda ms: daemon.status()["daemon"]["config_missing"] is False, 20, "config back")
    assert daemon.models()["a"]["pid"] == pid and "event=reload.done" not in daemon.log()

    # Broken, then fixed back to what runs: the stale failure is cleared.
    daemon.write_text(original.replace("port:", "prot:"))
    daemon.wait_for(lambda ms: (daemon.status()["daemon"]["last_reload"] or {}).get("ok") is False, 20, "failure")
    daemon.write_text(original)
    daemon.wait_for(lambda ms: daemon.status()["daemon"]["last_reload"]["ok"] is True, 20, "failure cleared")
    assert daemon.models()["a"]["pid"] == pid

    # Replaced through a symlink: the link's new target is read (and watched). Live keys: no new worker.
    def reloaded(count: int):
        return lambda ms: daemon.log().count("event=reload.done") == count + 1

    other = daemon.dir / "other.yaml"
    body = yaml.safe_load(original)
    body["models"]["a"]["max_tokens"] = 128
    other.write_text(yaml.safe_dump(body))
    link = daemon.dir / "link.tmp"
    link.symlink_to(other.name)
    done = daemon.log().count("event=reload.done")
    os.replace(link, daemon.config_path)
    daemon.wait_for(reloaded(done), 60, "symlink reload")
    assert "changed: a (max_tokens)" in daemon.status()["daemon"]["last_reload"]["plan"]
    body["models"]["a"]["max_tokens"] = 192  # an edit of the target, through the link
    other.write_text(yaml.safe_dump(body))
    daemon.wait_for(reloaded(done + 1), 60, "target edit reload")
    assert daemon.models()["a"]["pid"] == pid
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


def test_a_burst_of_saves_is_one_reload_of_the_last_content(daemon):
    port = free_port()
    daemon.write({"a": model_entry(port)})
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    reloads = daemon.log().count("event=reload.done")
    for i in range(50):  # 50 saves in a second
        daemon.write({"a": model_entry(port, prefill_step_size=200 + i)})
        time.sleep(0.02)
    daemon.wait_for(lambda ms: ms["a"]["pid"] != pid and ms["a"]["state"] == "ready", 60, "hammered reload")
    # One more save, of a live key, and its reload done: a second reload of the burst would be done
    # by then, or be part of this one's plan.
    daemon.write({"a": model_entry(port, prefill_step_size=249, max_tokens=64)})

    def marked(_models) -> bool:
        last = daemon.status()["daemon"]["last_reload"]
        return "max_tokens" in last["plan"] and daemon.log().count("event=reload.done") >= reloads + 2

    daemon.wait_for(marked, 60, "the reload after the burst")
    assert daemon.log().count("event=reload.done") == reloads + 2
    assert "prefill_step_size" not in daemon.status()["daemon"]["last_reload"]["plan"]  # the burst's last, applied
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


def test_a_second_daemon_on_the_same_state_dir_or_socket_refuses_to_start(daemon):
    daemon.write({"a": model_entry(free_port())})
    daemon.start()
    daemon.wait_ready({"a"})
    assert oct(daemon.state_dir.stat().st_mode & 0o777) == "0o700"
    second = daemon.spawn(None, daemon.dir / "second.log")
    assert second.wait(30) == 69
    log = (daemon.dir / "second.log").read_text()
    assert "event=daemon.already_running" in log and "another vllmmlxd (pid" in log and "state directory" in log
    # Another state directory, the same control socket: refused as well.
    config = yaml.safe_load(daemon.config_path.read_text())
    config["daemon"]["state_dir"] = str(daemon.dir / "state2")
    config["models"]["a"]["port"] = free_port()
    other = daemon.dir / "second.yaml"
    other.write_text(yaml.safe_dump(config))
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.cli", "run", "--config", str(other)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 69 and "control socket" in r.stderr, r.stderr[-2000:]
    assert daemon.models()["a"]["state"] == "ready"  # the first one is untouched


def test_a_notify_socket_nobody_reads_does_not_freeze_the_daemon(daemon):
    import socket as socketlib

    # A receiver that never reads, with the smallest buffer: it is full after a few datagrams,
    # and the watchdog (every 20 ms here) keeps sending.
    path = str(daemon.dir / "deaf.sock")
    deaf = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    deaf.setsockopt(socketlib.SOL_SOCKET, socketlib.SO_RCVBUF, 1)
    deaf.bind(path)
    try:
        daemon.write({"a": model_entry(free_port())})
        daemon.start(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "40000"})
        daemon.wait_ready({"a"})
        for _ in range(10):  # the control API keeps answering at once
            started = time.monotonic()
            assert daemon.ctl("status", timeout=10).returncode == 0
            assert time.monotonic() - started < 5
            time.sleep(0.2)
    finally:
        deaf.close()
