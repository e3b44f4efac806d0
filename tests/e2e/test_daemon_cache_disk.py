"""The prefix cache's disk tier on the real daemon: a resent prompt is a disk hit after a restart, a
swap or a crash, a damaged block file costs only a prefill (the answer is the cold one), and another
model sharing the directory never reads the blocks.

Two entries share one ``cache_disk`` directory: ``a`` (builtin:tiny) and ``b`` (a random-weight
qwen3 speaking tiny's tokenizer: the same tokens, so the same chain of block names, another model).
How much faster a disk hit is than a cold prefill is measured in bench/cache_tiers.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import Daemon, free_port, make_daemon, wait_gone
from tests.support.families import save
from tests.support.servers import greedy_completion
from vllmmlxd.engine.loading.builtin import ensure_builtin

pytestmark = pytest.mark.timeout(900)

# ~1,940 tokens of SmolLM2's vocabulary (builtin:tiny shares it): within tiny's 2,048-token context.
LONG = " ".join(f"Rule {i}: item {i} is on shelf {i % 7}." for i in range(127))


@pytest.fixture(scope="module")
def setup():
    d = make_daemon()
    kv = d.dir / "kv"
    ports = {"a": free_port(), "b": free_port()}
    entries = {
        "a": {"model": "builtin:tiny", "port": ports["a"], "cache_disk": {"dir": str(kv), "budget_gb": 1}},
        "b": {
            "model": str(save("qwen3", "float32", d.dir / "qwen3", tokenizer_from=ensure_builtin("tiny", d.state_dir))),
            "port": ports["b"],
            "cache_disk": {"dir": str(kv), "budget_gb": 1},
        },
    }
    d.write(entries)
    d.start()
    d.wait_ready({"a", "b"}, timeout=300)
    yield d, ports, entries, kv
    code = d.stop()
    assert wait_gone(d.worker_pids() if d.proc and d.proc.poll() is None else [])
    assert code in (0, None), d.log()[-3000:]


def url(ports: dict, name: str) -> str:
    return f"http://127.0.0.1:{ports[name]}"


def cache(ports: dict, name: str) -> dict:
    return httpx.get(url(ports, name) + "/v1/status", timeout=30).json()["cache"]


def complete(ports: dict, name: str, prompt: str = LONG) -> tuple[float, str, int]:
    """A greedy completion, streamed: (seconds to its first token, its text, prompt tokens from the cache)."""
    before = cache(ports, name)["cached_tokens"]
    first, text = greedy_completion(url(ports, name), prompt)
    return first, text, cache(ports, name)["cached_tokens"] - before


def written(ports: dict, name: str, blocks: int, timeout: float = 30) -> dict:
    """The entry's disk tier once its writer has written ``blocks`` files (it writes off the engine thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        disk = cache(ports, name)["disk"]
        if disk["files"] >= blocks:
            return disk
        time.sleep(0.1)
    raise AssertionError(f"{name}: {disk}")


def replaced(d: Daemon, name: str, pid: int, what: str) -> None:
    d.wait_for(lambda ms: ms[name]["pid"] not in (None, pid) and ms[name]["state"] == "ready", 120, what)
    # The old worker drains: until it exits it may still take a request (and answer from its memory).
    assert wait_gone([pid], timeout=60), what


def test_a_swap_and_a_crash_read_the_blocks_back_and_damaged_files_cost_only_a_prefill(setup):
    d, ports, entries, kv = setup
    _, cold, served = complete(ports, "a")
    assert served == 0
    disk = written(ports, "a", 1900 // 32)
    folder = Path(disk["dir"])
    assert folder.parent == kv and cache(ports, "a")["disk"]["blocks_read"] == 0

    # A reload that needs a new worker: the new one starts with an empty memory and reads the blocks back.
    pid = d.models()["a"]["pid"]
    d.write({**entries, "a": {**entries["a"], "prefill_step_size": 500}})
    replaced(d, "a", pid, "the swap")
    _, text, served = complete(ports, "a")
    assert served >= 1900 and text == cold
    assert cache(ports, "a")["disk"]["hits"] == 1

    # A worker killed outright: its successor finds the blocks too.
    pid = d.models()["a"]["pid"]
    os.kill(pid, signal.SIGKILL)
    replaced(d, "a", pid, "the restart after a crash")
    _, text, served = complete(ports, "a")
    assert served >= 1900 and text == cold

    # Every block file damaged: each is refused when read (and removed); the answer is the cold one.
    for f in folder.rglob("*.safetensors"):
        raw = bytearray(f.read_bytes())
        raw[-3] ^= 0x55
        f.write_bytes(bytes(raw))
    pid = d.models()["a"]["pid"]
    assert d.ctl("restart", "a").returncode == 0
    replaced(d, "a", pid, "the restart")
    _, text, served = complete(ports, "a")
    assert served == 0 and text == cold
    disk = cache(ports, "a")["disk"]
    assert disk["rejected"] >= 1 and disk["blocks_read"] == 0


def test_another_model_sharing_the_directory_never_reads_the_blocks(setup):
    _d, ports, _entries, kv = setup
    written(ports, "a", 1) if cache(ports, "a")["disk"]["files"] else complete(ports, "a")
    theirs = Path(cache(ports, "a")["disk"]["dir"])
    times = {f: f.stat().st_mtime_ns for f in theirs.rglob("*.safetensors")}
    mine = cache(ports, "b")["disk"]
    assert Path(mine["dir"]) != theirs and Path(mine["dir"]).parent == kv
    # The same tokens (one tokenizer), so the same chain of block names were the directory shared.
    _, _, served = complete(ports, "b", LONG[:1200])
    assert served == 0 and cache(ports, "b")["disk"]["blocks_read"] == 0
    assert {f: f.stat().st_mtime_ns for f in theirs.rglob("*.safetensors")} == times


def test_a_resend_after_a_restart_is_a_disk_hit_with_the_cold_answer(setup):
    d, ports, _, _ = setup
    prompt = "The shelves. " + LONG  # nothing of it in b's cache yet
    _, cold, served = complete(ports, "b", prompt)
    assert served == 0
    written(ports, "b", 1900 // 32)
    pid = d.models()["b"]["pid"]
    assert d.ctl("restart", "b").returncode == 0
    replaced(d, "b", pid, "the restart")
    _, text, served = complete(ports, "b", prompt)
    assert served >= 1900 and cache(ports, "b")["disk"]["hits"] == 1
    assert text == cold
