"""The prefix cache of models whose layers are not all attention, on the real daemon: a
Qwen3.5-shaped model (gated-delta recurrent layers beside attention: its state checkpointed at
block ends) and a Gemma-3-shaped one (sliding windows shorter than the prompt: their KV in the
blocks). For each, from memory and, after ``vllmmlxctl restart``, from the disk tier: an exact
resend of a ~2,000-token conversation, an agent's next turn on it, and a new conversation on its
~1,500-token system prompt each take at least 90% of what they share with what was sent before
from the cache, and answer as a cold run does (the same model beside it, with no cache).

The models are tiny random ones made with mlx-lm's classes (tests/support/families.py) speaking
builtin:tiny's tokenizer; their time to first token is measured in bench/cache_layered.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, wait_gone
from tests.support.families import save
from vllmmlxd.engine.loading.builtin import ensure_builtin

pytestmark = pytest.mark.timeout(600)

FAMILIES = {"hybrid": "qwen3_5", "windows": "gemma3_text"}
# ~1,500 tokens of builtin:tiny's vocabulary: an agent's instructions and tool descriptions.
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: item {i} is on shelf {i % 7}." for i in range(98))
HISTORY = [
    {
        "role": "user",
        "content": "Where is item 12? " + " ".join(f"Note {i}: shelf {i % 5} is blue." for i in range(20)),
    },
    {"role": "assistant", "content": "Item 12 is on shelf 5, which is blue according to the notes."},
    {
        "role": "user",
        "content": "And item 40? " + " ".join(f"Fact {i}: box {i} weighs {i % 9} kilos." for i in range(14)),
    },
]
FIRST = [{"role": "system", "content": SYSTEM}, *HISTORY]
OTHER = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List every rule about shelf 3, please."}]
REUSED = 0.9  # of what a prompt shares with what was sent before, at least


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = make_daemon()
    folder = tmp_path_factory.mktemp("models")
    tiny = ensure_builtin("tiny", d.state_dir)
    ports, entries, paths = {}, {}, {}
    for name, family in FAMILIES.items():
        path = paths[name] = str(save(family, "float32", folder / family, tokenizer_from=tiny))
        for suffix, cache in (
            ("", {"cache_disk": {"dir": str(d.dir / "kv"), "budget_gb": 1}}),
            ("-cold", {"cache_memory_mb": 0}),
        ):
            ports[name + suffix] = free_port()
            entries[name + suffix] = {"model": path, "port": ports[name + suffix], "prefill_step_size": 256, **cache}
    d.write(entries)
    d.start()
    d.wait_ready(set(entries), timeout=300)
    yield d, ports, paths
    d.stop()


def chat(ports: dict, name: str, messages: list[dict]) -> tuple[str, int, int]:
    """A greedy answer of 16 tokens: (its text, its prompt's tokens, those served from the cache)."""
    body = {"model": name, "messages": messages, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"http://127.0.0.1:{ports[name]}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return (
        r.json()["choices"][0]["message"]["content"],
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def shared(tokenizer, messages: list[dict], before: list[list[dict]]) -> int:
    """The tokens a prompt shares with the longest start of the prompts sent before it."""
    mine = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    best = 0
    for other in before:
        theirs = tokenizer.apply_chat_template(other, add_generation_prompt=True)
        n = 0
        while n < min(len(mine), len(theirs)) and mine[n] == theirs[n]:
            n += 1
        best = max(best, n)
    return best


def written(ports: dict, name: str, files: int, timeout: float = 60) -> None:
    """Wait for the entry's disk writer to have written ``files`` files (it writes off the engine thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        disk = httpx.get(f"http://127.0.0.1:{ports[name]}/v1/status", timeout=30).json()["cache"]["disk"]
        if disk["files"] >= files:
            return
        time.sleep(0.1)
    raise AssertionError(disk)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_resends_next_turns_and_new_chats_reuse_nine_tenths_from_memory_and_after_a_restart_from_disk(setup, name):
    from mlx_lm.utils import load_tokenizer

    d, ports, paths = setup
    status = httpx.get(f"http://127.0.0.1:{ports[name]}/v1/status", timeout=30).json()
    held = {"hybrid": "blocks+checkpoints", "windows": "blocks+windows"}[name]
    assert status["layout"]["prefix_cache"] == held and status["cache"]["holds"] == held
    assert status["source"] == FAMILIES[name]  # the folder's name, never the operator's path
    tokenizer = load_tokenizer(Path(paths[name]))
    answer, prompt_tokens, cached = chat(ports, name, FIRST)
    assert cached == 0 and prompt_tokens > 1900
    turn = [*FIRST, {"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks. And item 41?"}]
    asks = [("resend", FIRST, [FIRST]), ("next turn", turn, [FIRST]), ("new chat", OTHER, [FIRST])]
    for when in ("memory", "disk"):
        if when == "disk":
            written(ports, name, prompt_tokens // 32)
            pid = d.models()[name]["pid"]
            assert d.ctl("restart", name).returncode == 0
            d.wait_for(
                lambda ms, name=name, pid=pid: ms[name]["pid"] not in (None, pid) and ms[name]["state"] == "ready",
                120,
                "restart",
            )
            assert wait_gone([pid], timeout=60)
        for what, messages, before in asks:
            got, tokens, cached = chat(ports, name, messages)
            common = shared(tokenizer, messages, before)
            assert cached >= REUSED * common, (when, what, cached, common, tokens)
            assert got == chat(ports, name + "-cold", messages)[0], (when, what)
        if when == "memory":  # the next ones find this one's prompt too
            asks = [(what, messages, [FIRST, turn, OTHER]) for what, messages, _ in asks]
    disk = httpx.get(f"http://127.0.0.1:{ports[name]}/v1/status", timeout=30).json()["cache"]
    assert disk["disk"]["hits"] >= 1 and disk["disk"]["blocks_read"] >= prompt_tokens // 32  # after the restart
    if name == "hybrid":
        assert disk["checkpoint_hits"] >= 3 and disk["checkpoint_bytes"] > 0
