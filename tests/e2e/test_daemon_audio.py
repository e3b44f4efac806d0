"""A speech entry on the real daemon, called through the gateway by its model name with keys and
scopes and the official openai SDK: a lazy entry, loaded by the first upload; alice's key may use
it, bob's may not (his scope is other models), no key is refused, an unknown name is a 404; the
gateway forwards the form as sent, so its answer is the worker's own, streamed ones too."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.test_daemon_gateway import stop_daemon
from tests.support.audio import noise, wav
from tests.support.daemon import free_port, make_daemon

pytestmark = pytest.mark.timeout(300)
ALICE, BOB = "sk-alice-speech", "sk-bob-speech"


def test_transcriptions_through_the_gateway_by_model_name_with_keys_and_scopes():
    d = make_daemon()
    gateway_port, port = free_port(), free_port()
    keys = {"alice": {"key": ALICE, "models": ["ears"]}, "bob": {"key": BOB, "models": ["chat-*"]}}
    entry = {
        "model": "builtin:tiny-whisper",
        "port": port,
        "served_model_name": "my-whisper",
        "api_keys": ["*"],
        "load": "lazy",
    }
    d.write({"ears": {**entry, "aliases": ["whisper-1"]}}, api_keys=keys, gateway={"port": gateway_port})
    d.start(env={"VLLMMLXD_HEALTH_INTERVAL_S": "1"})
    try:
        d.wait_for(lambda ms: ms["ears"]["state"] == "unloaded", 60, "speech model waiting to be loaded")
        d.wait_for(lambda ms: (d.status().get("gateway") or {}).get("state") == "ready", what="gateway")
        audio = wav(noise(3.0, seed=3))

        def client(key: str, base: str = f"http://127.0.0.1:{gateway_port}") -> openai.OpenAI:
            return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)

        via_gateway = client(ALICE).audio.transcriptions.create(
            model="whisper-1", file=("a.wav", audio), temperature=0, response_format="verbose_json"
        )
        assert d.models()["ears"]["state"] in ("ready", "idle")  # the upload loaded it
        direct = client(ALICE, f"http://127.0.0.1:{port}").audio.transcriptions.create(
            model="my-whisper", file=("a.wav", audio), temperature=0, response_format="verbose_json"
        )
        assert via_gateway.text == direct.text and via_gateway.segments == direct.segments
        events = list(
            client(ALICE).audio.transcriptions.create(
                model="my-whisper", file=("a.wav", audio), temperature=0, stream=True
            )
        )
        assert events[-1].type == "transcript.text.done" and events[-1].text == direct.text
        with pytest.raises(openai.PermissionDeniedError):
            client(BOB).audio.transcriptions.create(model="my-whisper", file=("a.wav", audio))
        with pytest.raises(openai.NotFoundError):
            client(ALICE).audio.transcriptions.create(model="no-such-model", file=("a.wav", audio))
        anonymous = httpx.post(
            f"http://127.0.0.1:{gateway_port}/v1/audio/translations",
            files={"file": ("a.wav", audio)},
            data={"model": "my-whisper"},
            timeout=60,
        )
        assert anonymous.status_code == 401, anonymous.text
    finally:
        stop_daemon(d)
