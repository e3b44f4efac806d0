"""Ollama's /api/pull and /api/delete on the real daemon's gateway, driven by the official ``ollama``
Python client: a pull from the stand-in hub (builtin:tiny's folder in the hub's layout, reached
through ``HF_ENDPOINT`` by huggingface_hub's real download path in the daemon's pull process) with
its progress, the pulled model served through the Ollama port after a reload that adds an entry on
it, a delete refused while that entry uses it and one that removes an unused download, an unknown
repo's error and an Ollama library name's; a client that leaves mid-pull stops following, not the pull. One daemon for the file, with a store of its own: what it
pulls must not outlive the test. The names, lines and statuses are tested cheaper in
tests/unit/gateway/test_ollama_store.py and tests/integration/test_gateway_ollama_store.py."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.support.daemon import free_port, make_daemon, wait_gone
from tests.support.hub import StandInHub
from vllmmlxd.ctl.client import ControlClient

pytestmark = pytest.mark.timeout(300)
WEIGHTS = "model.safetensors"
STEPS = ["pulling manifest", "pulling org/tiny", "verifying sha256 digest", "writing manifest"]


class Setup:
    def __init__(self, hub: StandInHub, hf_home: str):
        self.hub = hub
        self.ports = {"gateway": free_port(), "ollama": free_port()}
        self.d = make_daemon()
        for name in ("models", "downloads"):  # a store of its own (make_daemon links the suite's)
            (self.d.state_dir / name).unlink()
            (self.d.state_dir / name).mkdir()
        self.write({})
        self.d.start(env={"HF_ENDPOINT": hub.url, "HF_HOME": hf_home, "HF_TOKEN": ""})

    def wait_gateway(self) -> None:
        self.d.wait_for(
            lambda ms: ((self.d.status() or {}).get("gateway") or {}).get("state") == "ready", 60, "gateway"
        )

    def write(self, models: dict) -> None:
        self.d.write(models, gateway={"port": self.ports["gateway"], "ollama_port": self.ports["ollama"]})

    def client(self) -> ollama.Client:
        return ollama.Client(host=f"http://127.0.0.1:{self.ports['ollama']}", timeout=120)

    def stored(self) -> set[str]:
        with ControlClient(self.d.socket) as control:
            return {m.name for m in control.store().models}


@pytest.fixture(scope="module")
def setup(state_dir, tmp_path_factory):
    from vllmmlxd.engine.loading.builtin import ensure_builtin

    tiny = ensure_builtin("tiny", state_dir)
    with StandInHub() as hub:
        hub.commits = {repo: hub.add_folder(repo, tiny) for repo in ("org/tiny", "org/spare")}
        s = Setup(hub, str(tmp_path_factory.mktemp("hf")))
        try:
            s.wait_gateway()
            yield s
        finally:
            pids = s.d.worker_pids() if s.d.proc and s.d.proc.poll() is None else []
            code = s.d.stop()
            assert wait_gone(pids)
            assert code in (0, None), s.d.log()[-3000:]


def test_a_pull_with_progress_then_served_after_a_reload_and_not_deleted_while_in_use(setup):
    setup.hub.faults.rate[WEIGHTS] = 6_000_000  # two seconds: progress lines on the way
    try:
        parts = list(setup.client().pull("org/tiny", stream=True))
    finally:
        setup.hub.faults.rate.clear()
    statuses = [p.status for p in parts]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    assert statuses[-2] == "org/tiny is in the store: an entry with model: org/tiny serves it"
    # A follower may see steps coalesced under load: those it sees are in order, never back.
    steps = [STEPS.index(s) for s in statuses[:-2]]
    assert steps == sorted(steps) and {0, 1} <= set(steps), statuses
    downloading = [p for p in parts if p.status == "pulling org/tiny"]
    assert all(p.digest == setup.hub.commits["org/tiny"] and p.total > 0 for p in downloading)
    done = [p.completed for p in downloading]
    assert done == sorted(done) and any(0 < c < downloading[0].total for c in done), done
    assert "org/tiny" in setup.stored()

    port = free_port()
    setup.write({"p": {"model": "org/tiny", "port": port, "cache_memory_mb": 64}})
    with ControlClient(setup.d.socket) as control:
        reloaded = control.reload()
    assert reloaded.ok, reloaded
    setup.d.wait_for(lambda ms: ms["p"]["state"] == "ready", 120, "p ready")
    client = setup.client()
    answer = client.chat(model="p", messages=[{"role": "user", "content": "Hello"}], options={"num_predict": 3})
    assert answer.done and 0 < answer.eval_count <= 3
    assert "p" in {m.model for m in client.list().models}

    with pytest.raises(ollama.ResponseError) as refused:
        client.delete("org/tiny")
    assert refused.value.status_code == 409 and "org/tiny is in use by p" in refused.value.error
    assert "org/tiny" in setup.stored()


def test_a_client_that_leaves_stops_following_not_the_pull_then_a_delete_of_what_no_entry_uses(setup):
    setup.hub.faults.rate[WEIGHTS] = 6_000_000
    url = f"http://127.0.0.1:{setup.ports['ollama']}/api/pull"
    try:
        with httpx.stream("POST", url, json={"model": "org/spare"}, timeout=60) as streamed:
            for line in streamed.iter_lines():
                if json.loads(line).get("completed"):
                    break  # gone mid-download
    finally:
        setup.hub.faults.rate.clear()
    with ControlClient(setup.d.socket) as control:
        (pull,) = [p for p in control.pulls() if p.repo == "org/spare"]
        ended = list(control.follow_pull(pull.id))[-1]
    assert ended.state == "done" and not ended.already, ended
    client = setup.client()
    assert client.pull("org/spare:latest").status == "success"  # stream: false answers the last line
    assert "org/spare" in setup.stored()
    assert client.delete("org/spare").status == "success"
    assert "org/spare" not in setup.stored()
    with pytest.raises(ollama.ResponseError) as gone:
        client.delete("org/spare")
    assert gone.value.status_code == 404 and "no model 'org/spare' in the store" in gone.value.error


def test_an_unknown_repo_and_an_ollama_library_name_are_ollamas_errors(setup):
    client = setup.client()
    missing = f"no model org/none on {setup.hub.url}"
    with pytest.raises(ollama.ResponseError) as whole:
        client.pull("org/none")
    assert whole.value.status_code == 404 and missing in whole.value.error
    with pytest.raises(ollama.ResponseError) as streamed:  # the stream's last line: {"error": ...}
        list(client.pull("org/none", stream=True))
    assert missing in streamed.value.error
    with pytest.raises(ollama.ResponseError) as library:
        client.pull("llama3.2:1b")
    assert library.value.status_code == 400 and "a Hugging Face repo id (org/name" in library.value.error
    assert "org/none" not in setup.stored()
