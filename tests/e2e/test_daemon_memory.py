"""Memory admission on the real daemon: a config whose models do not fit is refused at start
(exit 78) and at reload (the running models stay), with the numbers; a changed entry whose old
and new worker do not fit together is stopped, then started, and the plan says so first."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone
from vllmmlxd.config.schema import Config
from vllmmlxd.supervisor.memory import load_memory_plan

pytestmark = pytest.mark.timeout(300)

TOO_BIG = 10_000_000  # MB of cache: no machine has 9.5 TiB


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
    code = d.stop()
    assert wait_gone(pids)
    if code not in (0, None):
        pytest.fail(f"daemon exited {code}:\n{d.log()[-3000:]}")


def check(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllmmlxd.ctl", "check", str(path)], capture_output=True, text=True, timeout=60
    )


def test_a_config_that_does_not_fit_is_refused_at_start_with_the_numbers():
    d = make_daemon()
    d.write({"a": model_entry(free_port(), cache_memory_mb=TOO_BIG), "b": model_entry(free_port(), cache_memory_mb=0)})
    d.start()
    assert d.proc.wait(60) == 78
    log = d.log()
    refused = next(line for line in log.splitlines() if "event=memory.refused" in line)
    assert "level=error" in refused
    needed = int(re.search(r"needed_mb=(\d+)", refused)[1])
    usable = int(re.search(r"usable_mb=(\d+)", refused)[1])
    assert needed > TOO_BIG > usable > 0
    # The error names each entry with its numbers, biggest first, and says what to change.
    # (The weights' source may itself hold parentheses: "known size (not converted yet)" on a fresh state dir.)
    assert re.search(
        r"a: 10,000,\d{3} MB = \d+ MB weights \(builtin:tiny: .+?\) \+ 10,000,000 MB cache "
        r"\(cache_memory_mb\) \+ \d+ MB worker\\n  b: \d+ MB = ",
        refused,
    ), refused
    assert "lower cache_memory_mb or cache_memory_percent" in refused
    assert "event=memory.entry model=a" in log and "event=worker.starting" not in log

    r = check(d.config_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"{d.config_path}: refused: not enough memory: the models need {needed:,} MB")
    assert f"{usable:,} MB usable" in r.stderr and "10,000,000 MB cache" in r.stderr


def test_a_reload_that_does_not_fit_is_refused_and_the_running_model_keeps_serving(daemon):
    pa, pb = free_port(), free_port()
    daemon.write({"a": model_entry(pa, cache_memory_mb=64)}, daemon={"watch": False})
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]
    daemon.write(
        {"a": model_entry(pa, cache_memory_mb=TOO_BIG), "b": model_entry(pb, cache_memory_mb=64)},
        daemon={"watch": False},
    )

    dry = daemon.ctl("reload", "--dry-run")
    assert dry.returncode == 1 and dry.stdout == ""
    assert dry.stderr.startswith("the reload would fail; nothing changed:\nnot enough memory: the models need 10,000,")
    assert "    changed: a (cache_memory_mb)" in dry.stderr and "    added: b" in dry.stderr
    assert re.search(r"    memory: 10,000,\d{3} MB needed, [\d,]+ MB usable .*: does not fit", dry.stderr), dry.stderr
    assert daemon.status()["daemon"]["last_reload"] is None  # a dry run records nothing

    r = daemon.ctl("reload")
    assert r.returncode == 1 and "not enough memory" in r.stderr
    last = daemon.status()["daemon"]["last_reload"]
    assert last["ok"] is False
    assert re.search(r"^  a: 10,000,\d{3} MB = .* \+ 10,000,000 MB cache \(cache_memory_mb\)", last["error"], re.M)
    assert re.search(r"^  b: \d+ MB = \d+ MB weights .* \+ 64 MB cache", last["error"], re.M)
    assert re.search(r"need 10,000,\d{3} MB, [\d,]+ MB usable \([\d,]+ MB physical", last["error"])
    assert "memory: " in last["plan"] and "does not fit" in last["plan"]
    assert "event=reload.refused" in daemon.log()

    # The running set stays: same worker, still serving; b never started.
    models = daemon.models()
    assert set(models) == {"a"} and models["a"]["pid"] == pid and models["a"]["state"] == "ready"
    assert httpx.post(f"http://127.0.0.1:{pa}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    assert "FAILED" in daemon.ctl("status").stdout
    assert check(daemon.config_path).returncode == 1

    # Once it fits, the same reload applies, and the plan shows the numbers.
    daemon.write(
        {"a": model_entry(pa, cache_memory_mb=128), "b": model_entry(pb, cache_memory_mb=64)}, daemon={"watch": False}
    )
    ok = check(daemon.config_path)
    assert ok.returncode == 0 and re.search(r"^memory: [\d,]+ MB needed, .*: fits$", ok.stdout, re.M), ok.stdout
    r = daemon.ctl("reload")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^    memory: [\d,]+ MB needed, .*: fits$", r.stdout, re.M) and "a, changed: swap" in r.stdout
    daemon.wait_ready({"a", "b"})
    assert json.loads(daemon.ctl("status", "--json").stdout)["daemon"]["last_reload"]["ok"] is True


def test_a_changed_entry_whose_old_and_new_worker_do_not_fit_together_is_stopped_then_started(daemon, state_dir):
    pa = free_port()
    entry = model_entry(pa, cache_memory_mb=1024)
    one = load_memory_plan(Config.model_validate({"models": {"a": entry}}), state_dir)
    # Room for one worker and a half: a swap would hold two.
    reserve = one.capacity.physical_mb - one.entries["a"].total_mb * 3 // 2
    tight = {"watch": False, "memory_reserve_mb": reserve}
    daemon.write({"a": entry}, daemon=tight)
    daemon.start()
    daemon.wait_ready({"a"})
    pid = daemon.models()["a"]["pid"]

    daemon.write({"a": {**entry, "prefill_step_size": 300}}, daemon=tight)
    dry = daemon.ctl("reload", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert re.search(
        r"    a, changed: restart: not enough memory for both \(old and new worker at once would need "
        r"[\d,]+ MB of [\d,]+ MB\)",
        dry.stdout,
    ), dry.stdout
    r = daemon.ctl("reload")
    assert r.returncode == 0, r.stderr
    assert wait_gone([pid])
    new = daemon.models()["a"]
    assert new["state"] == "ready" and new["pid"] != pid
    log = daemon.log()
    assert "event=memory.restart model=a" in log
    # The old worker drained before the new one started.
    assert log.index("event=worker.draining model=a") < log.rindex("event=worker.starting model=a")

    # vllmmlxctl restart follows the same rule.
    r = daemon.ctl("restart", "a")
    assert r.returncode == 0 and "stopped first: not enough memory for both" in r.stdout

    # With room for both again, a change is a swap.
    roomy = {"watch": False, "memory_reserve_mb": 0}
    daemon.write({"a": {**entry, "prefill_step_size": 400}}, daemon=roomy)
    dry = daemon.ctl("reload", "--dry-run")
    assert "    a, changed: swap (old and new worker at once: " in dry.stdout, dry.stdout
