"""The daemon splits the machine's cores between its workers: each is pinned to its own share,
runs its BLAS with that many threads, and `vllmmlxctl status` shows which library and cores."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone
from vllmmlxd.runtime.blas_find import FINDERS
from vllmmlxd.runtime.cpus import default_threads

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
        reason="CPU shares apply on Linux, and splitting needs two cores",
    ),
]


def allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def expand(cpus: str) -> set[int]:
    from vllmmlxd.runtime.cpus import parse_cpus

    return set(parse_cpus(cpus))


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
    assert d.stop() in (0, None)
    assert wait_gone(pids)


def test_two_workers_get_disjoint_shares_and_status_names_their_blas(daemon):
    cores = len(os.sched_getaffinity(0))
    daemon.write({"a": model_entry(free_port()), "b": model_entry(free_port(), blas="/nonexistent/libblas.so")})
    daemon.start()
    daemon.wait_ready({"a", "b"})
    models = daemon.models()
    a, b = models["a"], models["b"]
    assert expand(a["cpus"]).isdisjoint(expand(b["cpus"]))
    assert len(expand(a["cpus"])) + len(expand(b["cpus"])) == cores
    assert a["threads"] == default_threads(len(expand(a["cpus"]))) and b["threads"] == 1  # bundled: one thread
    # The kernel agrees: each worker process is pinned to its share.
    assert expand(allowed_cpus(a["pid"])) == expand(a["cpus"])
    assert expand(allowed_cpus(b["pid"])) == expand(b["cpus"])

    installed = [name for name, find in FINDERS.items() if find()] or ["bundled"]
    real = a["blas"]
    assert real in installed and a["blas_path"] and Path(a["blas_path"]).is_file()
    assert b["blas"] == "bundled" and b["blas_warning"] == "/nonexistent/libblas.so: no such file"

    table = daemon.ctl("status")
    lines = table.stdout.splitlines()
    assert lines[0].split()[-3:] == ["BLAS", "THREADS", "CPUS"]
    row = {line.split()[0]: line.split() for line in lines[1:3]}
    assert row["a"][-3:] == [real, str(a["threads"]), a["cpus"]]
    assert row["b"][-3:] == ["bundled", "1", b["cpus"]]
    assert f"blas {real}: {a['blas_path']}" in table.stdout
    assert "b: /nonexistent/libblas.so: no such file" in table.stdout

    # Removing b leaves a on its cores (no needless restart); a restart moves it to the new plan.
    a_pid = a["pid"]
    daemon.write({"a": model_entry(a["port"])})
    daemon.wait_for(lambda ms: set(ms) == {"a"}, 30, "b removed")
    assert daemon.models()["a"]["pid"] == a_pid and daemon.models()["a"]["cpus"] == a["cpus"]
    assert "event=cpu.share_kept model=a" in daemon.log()
    assert daemon.ctl("restart", "a").returncode == 0
    after = daemon.models()["a"]
    assert after["pid"] != a_pid and expand(after["cpus"]) == set(os.sched_getaffinity(0))
    threads = default_threads(cores)
    assert after["threads"] == threads and expand(allowed_cpus(after["pid"])) == set(os.sched_getaffinity(0))
    assert json.loads(daemon.ctl("status", "--json").stdout)["models"][0]["threads"] == threads
