"""A replica set on the real daemon: two builtin:tiny workers under ``group: tiny`` behind the
gateway. A burst is answered by both, a growing conversation stays on one, kill -9 of one worker
while requests are in flight fails none of them, and the worker the daemon restarts gets traffic
again. One daemon for the file; only routing, headers and counts are asserted (random weights)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone

pytestmark = pytest.mark.timeout(300)
FAST = {"VLLMMLXD_HEALTH_INTERVAL_S": "1"}
BACKEND = "x-vllmmlxd-backend"


class ReplicaDaemon:
    def __init__(self):
        self.ports = {"a": free_port(), "b": free_port()}
        self.gateway_port = free_port()
        self.d = make_daemon()
        models = {name: model_entry(port, group="tiny", cache_memory_mb=64) for name, port in self.ports.items()}
        self.d.write(models, gateway={"port": self.gateway_port})
        self.d.start(env=FAST)
        self.d.wait_for(
            lambda ms: (
                all(ms[n]["state"] == "ready" for n in self.ports)
                and (self.d.status().get("gateway") or {}).get("state") == "ready"
            ),
            what="both replicas and the gateway ready",
        )
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{self.gateway_port}",
            timeout=120,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    def chat(self, content: str, **kw) -> httpx.Response:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 2,
            "temperature": 0,
            **kw,
        }
        return self.http.post("/v1/chat/completions", json=body)

    def burst(self, n: int, **kw) -> list[httpx.Response]:
        with cf.ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda i: self.chat(f"request {i}", **kw), range(n)))


@pytest.fixture(scope="module")
def replicas():
    r = ReplicaDaemon()
    yield r
    r.http.close()
    pids = r.d.worker_pids() if r.d.proc and r.d.proc.poll() is None else []
    code = r.d.stop()
    assert wait_gone(pids)
    assert code in (0, None), f"daemon exited {code}:\n{r.d.log()[-3000:]}"


def test_a_burst_is_answered_by_both_replicas_under_the_groups_name(replicas):
    answers = replicas.burst(32)
    assert [r.status_code for r in answers] == [200] * 32
    backends = [r.headers[BACKEND] for r in answers]
    assert set(backends) == {"a", "b"}, backends
    assert {r.json()["model"] for r in answers} == {"a", "b"}  # each answers under its own name
    # Both API families, streamed too; the group is listed once beside its members.
    anthropic = replicas.http.post(
        "/v1/messages",
        json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert anthropic.status_code == 200 and anthropic.headers[BACKEND] in ("a", "b")
    with replicas.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "s"}], "max_tokens": 2, "stream": True},
    ) as stream:
        assert stream.status_code == 200 and stream.headers[BACKEND] in ("a", "b")
        assert list(stream.iter_lines())[-2:] == ["data: [DONE]", ""]
    ids = [c["id"] for c in replicas.http.get("/v1/models").json()["data"]]
    assert ids.count("tiny") == 1 and {"a", "b"} <= set(ids)
    # A member by its own name is answered by that member.
    assert (
        replicas.http.post("/v1/completions", json={"model": "b", "prompt": "x", "max_tokens": 2}).headers[BACKEND]
        == "b"
    )


def test_a_growing_conversation_stays_on_one_replica(replicas):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    seen = []
    for turn in range(4):
        r = replicas.http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 3, "temperature": 0}
        )
        assert r.status_code == 200
        seen.append(r.headers[BACKEND])
        reply = r.json()["choices"][0]["message"]["content"] or "..."
        messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": f"and {turn}?"}]
    assert len(set(seen)) == 1, seen


def test_kill_9_of_a_replica_under_load_fails_no_request_and_it_comes_back(replicas):
    d = replicas.d
    victim_pid = d.models()["a"]["pid"]
    worker = f"http://127.0.0.1:{replicas.ports['a']}/v1/status"
    with cf.ThreadPoolExecutor(32) as pool:
        # Long enough answers that the kill finds requests mid-generation on the victim.
        futures = [pool.submit(replicas.chat, f"load {i}", max_tokens=96, ignore_eos=True) for i in range(32)]
        deadline = time.monotonic() + 30
        while httpx.get(worker, timeout=5).json()["num_running"] == 0:
            assert time.monotonic() < deadline, "the victim never got a request"
            time.sleep(0.02)
        os.kill(victim_pid, signal.SIGKILL)
        answers = [f.result() for f in futures]
    assert [r.status_code for r in answers] == [200] * 32, [r.text for r in answers if r.status_code != 200]
    assert {r.headers[BACKEND] for r in answers} >= {"b"}
    # The victim's requests in flight were sent to the other replica.
    failovers = [line for line in d.log().splitlines() if "event=gateway.failover" in line]
    assert failovers and all("group=tiny route=a" in line for line in failovers), failovers

    d.wait_for(lambda ms: ms["a"]["state"] == "ready" and ms["a"]["pid"] not in (None, victim_pid), what="a back")
    groups = d.status()["groups"]
    assert [(m["name"], m["state"]) for m in groups[0]["members"]] == [("a", "ready"), ("b", "ready")]
    # Back in the set: new requests reach it again (the push showing it ready ends its ejection).
    deadline = time.monotonic() + 20
    backends: set[str] = set()
    while "a" not in backends and time.monotonic() < deadline:
        backends |= {r.headers[BACKEND] for r in replicas.burst(4)}
    assert "a" in backends
    health = replicas.http.get("/api/health").json()["groups"]["tiny"]
    assert health["state"] == "ready" and set(health["members"]) == {"a", "b"}
    assert "group tiny: ready; a ready" in d.ctl("status").stdout


def test_a_keys_rate_limit_holds_for_the_whole_set_when_the_gateway_counts_it(replicas):
    # The finding: each member counted a key's rate_limit on its own, so two members gave it twice
    # as many requests. With gateway.groups.tiny the gateway counts the key for the set as a whole
    # (members named directly count there too); each member keeps its own count as well.
    d = replicas.d
    models = {
        name: model_entry(port, group="tiny", cache_memory_mb=64, api_keys=["alice"])
        for name, port in replicas.ports.items()
    }
    keys = {"alice": {"key": "alice-secret", "models": ["*"], "rate_limit": "3/minute"}}
    d.write(models, api_keys=keys, gateway={"port": replicas.gateway_port, "groups": {"tiny": {}}})
    assert d.ctl("reload").returncode == 0, d.log()[-2000:]
    auth = {"Authorization": "Bearer alice-secret"}

    def ask(model: str) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return replicas.http.post("/v1/chat/completions", json=body, headers=auth)

    deadline = time.monotonic() + 30
    while ask("tiny").status_code == 401:  # until the pushed keys reach the gateway and workers
        assert time.monotonic() < deadline, "the key never took effect"
        time.sleep(0.2)
    answers = [ask("tiny"), ask("a")]  # with the one above: three, the key's budget
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    over = ask("tiny")
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1, over.text
    assert over.json()["error"]["type"] == "rate_limit_error" and "key 'alice'" in over.json()["error"]["message"]
    assert ask("b").status_code == 429  # a member by its name is the same set's budget
