"""Multi-token-prediction drafts on a real worker: `vllmmlxd serve QWEN3.5-SHAPED --speculative mtp`
on a checkpoint that carries its MTP layer (random weights made here, the model and its MTP layer
made predictable so every draft is known), answers equal the same worker's with speculation off
per request, /v1/status reports the method and its acceptance; a checkpoint without MTP layers
is refused at load, saying why."""

from __future__ import annotations

import httpx
import pytest

from tests.support.families import save
from tests.support.servers import start_serve
from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.paths import resolve_state_dir

CYCLE = range(1000, 1060)  # ordinary tokens of builtin:tiny's vocabulary


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tiny = ensure_builtin("tiny", resolve_state_dir())
    folder = tmp_path_factory.mktemp("mtp") / "qwen3_5-mtp"
    path = save("qwen3_5", "float32", folder, tokenizer_from=tiny, cycle=CYCLE, mtp=True)
    s = start_serve(str(path), "--speculative", "mtp", "--num-draft", "4")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def complete(server, prompt: list[int], **extra) -> dict:
    body = {"model": "m", "prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True, **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_mtp_drafts_keep_the_answer_and_status_reports_their_acceptance(server):
    prompt = [*CYCLE[:40]]  # no repeat: prompt lookup would have nothing to draft here
    drafted = complete(server, prompt, logprobs=0, return_tokens_as_token_ids=True)
    plain = complete(server, prompt, speculative=False, logprobs=0, return_tokens_as_token_ids=True)
    expected = [f"token_id:{CYCLE[(40 + i) % len(CYCLE)]}" for i in range(32)]
    assert drafted["choices"][0]["logprobs"]["tokens"] == plain["choices"][0]["logprobs"]["tokens"] == expected
    status = httpx.get(server.url + "/v1/status").json()
    spec = status["speculative"]
    assert spec["method"] == "mtp" and spec["drafted_tokens"] > 16 and spec["acceptance_rate"] == 1.0
    assert status["layout"]["rollback"] == "replay" and status["layout"]["speculation"] is None


def test_a_checkpoint_without_mtp_layers_is_refused_at_load_saying_why():
    with pytest.raises(Exception) as failed:
        start_serve("builtin:tiny", "--speculative", "mtp")
    assert "carries no multi-token-prediction layers" in str(failed.value)
