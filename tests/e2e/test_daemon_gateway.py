"""The gateway on the real daemon: two builtin:tiny entries and an upstream (a third worker the
test starts, as another host's daemon would serve it), called through one address with the
official SDKs and httpx; the upstream killed and restarted; a reload swapping a model under
streaming clients; lazy models loaded on first request and evicted under memory admission."""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time

import anthropic
import httpx
import openai
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone
from tests.support.servers import start_serve
from vllmmlxd.config.schema import Config
from vllmmlxd.runtime.memory import MIB, read_machine_memory
from vllmmlxd.supervisor.memory import load_memory_plan

pytestmark = pytest.mark.timeout(600)
FAST = {"VLLMMLXD_HEALTH_INTERVAL_S": "1"}
LLAMA, QWEN, FAR = "Llama-3.3-70B-Instruct-4bit", "Qwen2.5-72B-Instruct-4bit", "far-model"


def stop_daemon(d) -> None:
    pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
    status = d.status() if d.proc and d.proc.poll() is None else None
    gateway_pid = ((status or {}).get("gateway") or {}).get("pid")
    code = d.stop()
    assert wait_gone(pids + ([gateway_pid] if gateway_pid else []))
    assert code in (0, None), f"daemon exited {code}:\n{d.log()[-3000:]}"


class Cluster:
    def __init__(self):
        self.upstream_port = free_port()
        self.upstream = start_serve("builtin:tiny", "--served-model-name", FAR, port=self.upstream_port)
        self.gateway_port = free_port()
        self.ports = {"llama": free_port(), "qwen": free_port()}
        self.d = make_daemon()
        self.models = {
            "llama": model_entry(
                self.ports["llama"],
                served_model_name=LLAMA,
                aliases=["l"],
                cache_memory_mb=64,
                embedding_model="builtin:all-minilm-l6-v2",
            ),
            "qwen": model_entry(self.ports["qwen"], served_model_name=QWEN, aliases=["q"], cache_memory_mb=64),
            "far": {"upstream": f"http://127.0.0.1:{self.upstream_port}", "served_model_name": FAR},
        }
        self.gateway = {"port": self.gateway_port, "upstream_health_interval_s": 1}
        self.d.write(self.models, gateway=self.gateway)
        self.d.start(env=FAST)
        self.wait_states({"llama": "ready", "qwen": "ready", "far": "ready"})
        self.d.wait_for(lambda ms: (self.d.status().get("gateway") or {}).get("state") == "ready", what="gateway")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def wait_states(self, want: dict, timeout: float = 180) -> None:
        self.d.wait_for(lambda ms: all(ms[n]["state"] == s for n, s in want.items()), timeout, f"states {want}")

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="not-needed", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    stop_daemon(c.d)
    c.upstream.stop()


@pytest.mark.parametrize(
    "name, served",
    [
        (LLAMA, LLAMA),
        ("llama", LLAMA),
        ("l", LLAMA),
        (QWEN, QWEN),
        ("qwen", QWEN),
        ("q", QWEN),
        (FAR, FAR),
        ("far", FAR),
    ],
)
def test_each_name_and_alias_routes_through_both_api_families(cluster, name, served):
    chat = cluster.openai().chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.model == served and chat.choices[0].message.content is not None
    text = cluster.openai().completions.create(model=name, prompt="Once", max_tokens=3)
    assert text.model == served
    message = cluster.anthropic().messages.create(
        model=name, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.model == served and message.content[0].type == "text"
    count = cluster.anthropic().messages.count_tokens(model=name, messages=[{"role": "user", "content": "hi"}])
    assert count.input_tokens > 0


def test_embeddings_route_by_the_embedding_models_name_or_its_entrys(cluster):
    for name in ("all-minilm-l6-v2", "llama", LLAMA):
        out = cluster.openai().embeddings.create(model=name, input=["Hello world", "Hi there, world!"])
        assert len(out.data) == 2 and len(out.data[0].embedding) == 384
    cards = {m["id"]: m for m in httpx.get(cluster.url + "/v1/models", timeout=10).json()["data"]}
    assert cards["all-minilm-l6-v2"]["entry"] == "llama"


def test_models_lists_every_model_with_its_state_and_an_unknown_one_lists_them(cluster):
    cards = {m["id"]: m for m in httpx.get(cluster.url + "/v1/models", timeout=10).json()["data"]}
    assert {LLAMA, QWEN, FAR} <= set(cards)
    states = {n: cards[n]["state"] for n in (LLAMA, QWEN, FAR)}
    assert set(states.values()) == {"ready"}, states
    with pytest.raises(openai.NotFoundError) as oa:
        cluster.openai().chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert "gpt-9" in str(oa.value) and LLAMA in str(oa.value) and QWEN in str(oa.value)
    with pytest.raises(anthropic.NotFoundError) as an:
        cluster.anthropic().messages.create(model="claude-9", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert an.value.body["type"] == "error" and an.value.body["error"]["type"] == "not_found_error"
    assert FAR in an.value.body["error"]["message"]


def test_streams_pass_through_as_they_come_and_a_disconnect_stops_the_generation(cluster):
    stamps = []
    stream = cluster.openai().chat.completions.create(
        model="q",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=40,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.monotonic())
    assert len(stamps) >= 20
    assert stamps[-1] - stamps[0] > 0.05  # spread over time: not buffered into one write

    body = {"model": "llama", "prompt": "x", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as client, client.stream("POST", cluster.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break
        # Leaving the block closed the connection mid-stream.
    worker = f"http://127.0.0.1:{cluster.ports['llama']}/v1/status"
    deadline = time.monotonic() + 5
    while httpx.get(worker, timeout=5).json()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(worker, timeout=5).json()["num_running"] == 0


def test_the_cluster_endpoints(cluster):
    with httpx.stream(
        "POST",
        cluster.url + "/api/chat",
        timeout=60,
        json={
            "model": "llama",
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "temperature": 0.7,
            "top_p": 1.0,
        },
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["model"] == LLAMA
    assert "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])

    with httpx.stream(
        "POST",
        cluster.url + "/api/complete",
        timeout=60,
        json={"model": "qwen", "prompt": "La capitale", "max_tokens": 5},
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["object"] == "text_completion"

    models = httpx.get(cluster.url + "/api/models", timeout=10).json()["data"]
    assert {m["id"] for m in models} >= {"llama", "qwen", "far"}
    far = next(m for m in models if m["id"] == "far")
    assert (far["name"], far["kind"], far["state"]) == (FAR, "upstream", "ready")
    health = httpx.get(cluster.url + "/api/health", timeout=10).json()
    assert health["status"] == "ok" and health["models"]["qwen"] == {"state": "ready", "model": QWEN, "ok": True}
    status = httpx.get(cluster.url + "/api/status", timeout=10).json()
    assert {m["name"] for m in status["models"]} >= {"llama", "qwen", "far"}


def test_an_upstream_that_goes_away_is_unreachable_and_comes_back(cluster):
    cluster.upstream.stop()
    cluster.wait_states({"far": "unreachable"}, timeout=20)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as gone:
        cluster.openai().chat.completions.create(model=FAR, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert gone.value.status_code == 503 and time.monotonic() - started < 5
    # The others carry on.
    assert cluster.openai().completions.create(model="l", prompt="x", max_tokens=2).model == LLAMA
    health = httpx.get(cluster.url + "/api/health", timeout=10).json()
    assert health["status"] == "degraded" and health["models"]["far"]["state"] == "unreachable"
    assert "unreachable" in cluster.d.ctl("status").stdout

    cluster.upstream = start_serve("builtin:tiny", "--served-model-name", FAR, port=cluster.upstream_port)
    cluster.wait_states({"far": "ready"}, timeout=20)
    assert cluster.openai().completions.create(model=FAR, prompt="x", max_tokens=2).model == FAR


def test_a_reload_that_swaps_a_model_fails_no_request_through_the_gateway(cluster):
    failures, done = [], []
    stop = threading.Event()

    def client(n: int) -> None:
        oa = cluster.openai()
        while not stop.is_set():
            try:
                stream = oa.chat.completions.create(
                    model="qwen", messages=[{"role": "user", "content": f"hi {n}"}], max_tokens=12, stream=True
                )
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                done.append(len(text))
            except Exception as exc:
                failures.append(repr(exc))

    def answered_past(count: int) -> None:
        """Until more than ``count`` answers are in (or one failed): past those in flight, one came after."""
        deadline = time.monotonic() + 60
        while len(done) <= count and not failures:
            assert time.monotonic() < deadline, f"{len(done)} answers, not more than {count}"
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        answered_past(len(threads) - 1)  # requests run when the reload lands
        old_pid = cluster.d.models()["qwen"]["pid"]
        models = {
            **cluster.models,
            "qwen": {**cluster.models["qwen"], "max_num_seqs": 8},  # a new worker
            "llama": {**cluster.models["llama"], "aliases": ["l", "ll"]},
        }  # live: a new name to route
        cluster.d.write(models, gateway=cluster.gateway)
        r = cluster.d.ctl("reload")
        assert r.returncode == 0, r.stdout + r.stderr
        cluster.d.wait_for(
            lambda ms: ms["qwen"]["pid"] not in (None, old_pid) and ms["qwen"]["state"] == "ready", what="qwen swapped"
        )
        answered_past(len(done) + len(threads))  # and after it
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert failures == [] and len(done) >= 6
    cluster.models = models
    # The routing table followed the reload: the new alias routes, with no restart of anything.
    assert cluster.openai().completions.create(model="ll", prompt="x", max_tokens=2).model == LLAMA


def test_lazy_models_load_on_first_request_and_make_room_for_each_other():
    """Idle unloads on the real daemon, and a load again after one: test_daemon_lazy."""
    ports = {n: free_port() for n in ("a", "l1", "l2")}
    d = make_daemon()
    models = {"a": model_entry(ports["a"], cache_memory_mb=64)}
    models |= {n: model_entry(ports[n], cache_memory_mb=64, load="lazy", idle_unload_s=300) for n in ("l1", "l2")}
    config = Config.model_validate({"daemon": {"state_dir": str(d.state_dir)}, "models": models})
    each = load_memory_plan(config, d.state_dir).entries["l1"].total_mb
    physical = read_machine_memory().physical // MIB
    gateway_port = free_port()
    # Room for the eager model and one lazy model, never two.
    d.write(
        models,
        daemon={"memory_reserve_mb": physical - (2 * each + each // 2)},
        gateway={"port": gateway_port, "load_timeout": 120},
    )
    url = f"http://127.0.0.1:{gateway_port}"
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    d.start(env=FAST)
    try:
        d.wait_for(
            lambda ms: (
                ms["a"]["state"] == "ready"
                and ms["l1"]["state"] == "unloaded"
                and (d.status().get("gateway") or {}).get("state") == "ready"
            ),
            what="started",
        )
        states = {m["id"]: m["state"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
        assert states["l1"] == "unloaded" and states["l2"] == "unloaded"

        # First requests, two at once: they wait for one load, and are answered.
        def ask_l1(_):
            return oa.chat.completions.create(
                model="l1", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            ).model

        with cf.ThreadPoolExecutor(2) as pool:
            assert list(pool.map(ask_l1, range(2))) == ["l1", "l1"]
        assert sum("event=gateway.load_requested model=l1" in line for line in d.log().splitlines()) == 1
        assert d.models()["l1"]["state"] in ("idle", "ready")
        # A streamed request to the other lazy model: its SSE head at once, a loading comment, then the
        # model's stream; l1 (idle) is unloaded to make room.
        body = {"model": "l2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        data = [line for line in lines if not line.startswith(":")]  # a comment every 5 s while it loads
        assert lines[0] == ": loading l2" and data[0].startswith("data: {") and data[-1] == "data: [DONE]"
        ms = d.models()
        assert ms["l1"]["state"] == "unloaded" and ms["l2"]["state"] in ("idle", "ready")
        assert any("event=model.unloading model=l1 reason=memory for_model=l2" in line for line in d.log().splitlines())

        # l2 busy: nothing can make room for l1, which gets a clear 503.
        with (
            httpx.Client(timeout=120) as client,
            client.stream(
                "POST",
                url + "/v1/completions",
                json={"model": "l2", "prompt": "x", "max_tokens": 3000, "ignore_eos": True, "stream": True},
            ) as busy,
        ):
            lines = busy.iter_lines()  # held: a dropped generator would close the stream
            next(lines)
            d.wait_for(lambda ms: ms["l2"]["running"], timeout=30, what="l2 busy")
            with pytest.raises(openai.APIStatusError) as refused:
                oa.chat.completions.create(model="l1", messages=[{"role": "user", "content": "x"}], max_tokens=2)
            assert refused.value.status_code == 503
            assert "not enough memory to load l1" in str(refused.value)
            # Streamed, the refusal comes after the loading comment, as an error event in the family's shape.
            anth = {"model": "l1", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "x"}]}
            with httpx.stream("POST", url + "/v1/messages", json=anth, timeout=120) as r:
                events = [line for line in r.iter_lines() if line]
            told = [line for line in events if not line.startswith(":")]
            assert events[0] == ": loading l1" and told[0] == "event: error"
            error = json.loads(told[1][6:])["error"]
            assert error["type"] == "overloaded_error" and "not enough memory to load l1" in error["message"]
    finally:
        stop_daemon(d)
