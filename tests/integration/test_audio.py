"""POST /v1/audio/transcriptions and /v1/audio/translations on a real worker (`vllmmlxd serve
builtin:tiny-whisper`), called with the official openai SDK in every response_format and streamed.

builtin:tiny-whisper's weights are random, so what it transcribes is noise: each answer is
checked equal to mlx-audio's own transcription of the same file with the same weights, run in
this process from the file's path (mlx-audio decodes it itself), greedy (temperature 0) — never
its content. Bad audio, too long, too large and the wrong type are 4xx, and the worker answers on.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import warnings
from pathlib import Path

import httpx
import openai
import pytest
import requests

from tests.support.audio import encode, noise, tone, wav
from tests.support.servers import start_serve
from vllmmlxd.engine.loading.builtin import ensure_builtin

pytestmark = pytest.mark.timeout(600)
MODEL = "whisper-test"
SECONDS = 4.0


@pytest.fixture(scope="module")
def server():
    s = start_serve(
        "builtin:tiny-whisper",
        "--served-model-name",
        MODEL,
        "--max-audio-s",
        "40",
        "--max-audio-mb",
        "2",
        "--api-key",
        "sk-audio",
        "--enable-metrics",
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-audio", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def reference(state_dir):
    """mlx-audio's own Whisper over the same folder the worker serves."""
    from mlx_audio.stt import load  # type: ignore[import-untyped]

    model = load(ensure_builtin("tiny-whisper", state_dir))

    def transcribe(path: Path, **options):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # word timestamps of a translation "may not be reliable"
            return model.generate(str(path), verbose=None, **options)

    return transcribe


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "clip.wav"
    path.write_bytes(wav(noise(SECONDS, seed=7)))
    return path


def test_json_and_text_equal_mlx_audios_transcription(client, reference, clip):
    expected = reference(clip, temperature=0.0)
    with clip.open("rb") as f:
        got = client.audio.transcriptions.create(model=MODEL, file=f, temperature=0)
    assert got.text == expected.text.strip() and got.text
    assert got.usage is not None and got.usage.type == "duration" and got.usage.seconds == SECONDS
    with clip.open("rb") as f:
        text = client.audio.transcriptions.create(model=MODEL, file=f, temperature=0, response_format="text")
    assert text == expected.text.strip()


def test_verbose_json_equals_mlx_audios_segments_and_words(client, reference, clip):
    expected = reference(clip, temperature=0.0, language="en", word_timestamps=True)
    with clip.open("rb") as f:
        got = client.audio.transcriptions.create(
            model=MODEL,
            file=f,
            temperature=0,
            language="en",
            response_format="verbose_json",
            timestamp_granularities=["segment", "word"],
        )
    assert got.language == "english" and got.duration == SECONDS and got.text == expected.text.strip()
    assert got.segments is not None and got.words is not None
    assert [(s.id, s.seek, s.start, s.end, s.text, s.tokens) for s in got.segments] == [
        (s["id"], s["seek"], s["start"], s["end"], s["text"], s["tokens"]) for s in expected.segments
    ]
    assert [(w.word, w.start, w.end) for w in got.words] == [
        (w["word"], w["start"], w["end"]) for s in expected.segments for w in s["words"]
    ]


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_carry_mlx_audios_segments(client, reference, clip, fmt):
    expected = reference(clip, temperature=0.0, language="en")
    with clip.open("rb") as f:
        body = client.audio.transcriptions.create(
            model=MODEL, file=f, temperature=0, language="en", response_format=fmt
        )
    texts = [s["text"].strip() for s in expected.segments if s["text"].strip()]
    cues = [block.splitlines() for block in body.strip().split("\n\n")]
    if fmt == "vtt":
        assert cues[0] == ["WEBVTT"]
        cues = cues[1:]
    else:
        assert [c[0] for c in cues] == [str(i) for i in range(1, len(texts) + 1)]
        cues = [c[1:] for c in cues]
    assert ["\n".join(c[1:]) for c in cues] == texts
    assert all(" --> " in c[0] for c in cues)


def test_streamed_deltas_add_up_to_mlx_audios_text(client, reference, clip):
    expected = reference(clip, temperature=0.0).text.strip()
    with clip.open("rb") as f:
        events = list(client.audio.transcriptions.create(model=MODEL, file=f, temperature=0, stream=True))
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done" and events[-1].text == expected
    assert "".join(e.delta for e in events[:-1]) == expected


def test_audio_past_one_window_equals_mlx_audios_and_uploads_queue(client, reference, tmp_path):
    """35 s: two of Whisper's 30 s windows, the second prompted with the first's text."""
    path = tmp_path / "long.wav"
    path.write_bytes(wav(noise(35.0, seed=11)))
    expected = reference(path, temperature=0.0, language="en")
    assert expected.segments[-1]["seek"] > 0  # the second window was decoded

    def one(_: int) -> openai.types.audio.TranscriptionVerbose:
        return client.audio.transcriptions.create(
            model=MODEL,
            file=("long.wav", path.read_bytes()),
            temperature=0,
            language="en",
            response_format="verbose_json",
        )

    with cf.ThreadPoolExecutor(3) as pool:  # three at once: queued for the speech thread, each answered
        answers = list(pool.map(one, range(3)))
    for got in answers:
        assert got.text == expected.text.strip() and got.duration == 35.0
        assert [(s.seek, s.start, s.end, s.tokens) for s in got.segments or []] == [
            (s["seek"], s["start"], s["end"], s["tokens"]) for s in expected.segments
        ]


def test_a_translation_equals_mlx_audios_translate_task(client, reference, clip):
    expected = reference(clip, temperature=0.0, task="translate")
    with clip.open("rb") as f:
        got = client.audio.translations.create(model=MODEL, file=f, temperature=0, response_format="verbose_json")
    assert got.text == expected.text.strip()
    assert got.model_extra is not None and got.model_extra["task"] == "translate"


def test_a_prompt_is_whispers_initial_prompt(client, reference, clip):
    expected = reference(clip, temperature=0.0, language="en", initial_prompt="Kenobi, Skywalker")
    with clip.open("rb") as f:
        got = client.audio.transcriptions.create(
            model=MODEL, file=f, temperature=0, language="en", prompt="Kenobi, Skywalker"
        )
    assert got.text == expected.text.strip()


def test_other_formats_are_transcribed(client):
    for fmt in ("mp3", "m4a", "flac", "ogg", "webm"):
        data = encode(tone(2.0, rate={"ogg": 48000, "webm": 48000}.get(fmt, 44100)), fmt)
        got = client.audio.transcriptions.create(model=MODEL, file=(f"a.{fmt}", data), temperature=0)
        assert isinstance(got.text, str), fmt


def post(server, files, data=None, headers=None) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/audio/transcriptions",
        files=files,
        data=data or {},
        headers={"authorization": "Bearer sk-audio"} if headers is None else headers,
        timeout=120,
    )


def test_refusals_are_4xx_in_openais_shape_and_the_worker_answers_on(server, client, clip):
    cases = [
        ({"file": ("notes.txt", b"these are my notes\n" * 50, "text/plain")}, {}, 400, "could not be decoded"),
        ({"file": ("a.wav", b"", "audio/wav")}, {}, 400, "empty"),
        ({"file": ("big.wav", wav(noise(70.0)), "audio/wav")}, {}, 413, "max_audio_mb"),  # 2.2 MB
        ({"file": ("a.wav", clip.read_bytes(), "audio/wav")}, {"response_format": "xml"}, 400, "response_format"),
        ({"file": ("a.wav", clip.read_bytes(), "audio/wav")}, {"temperature": "2"}, 400, "temperature"),
        ({"file": ("a.wav", clip.read_bytes(), "audio/wav")}, {"language": "klingon"}, 400, "klingon"),
        ({"other": ("a.wav", clip.read_bytes(), "audio/wav")}, {}, 400, "file is required"),
    ]
    for files, data, status, words in cases:
        r = post(server, files, data)
        assert r.status_code == status, (words, r.text)
        error = r.json()["error"]
        assert words in error["message"] and error["type"] == "invalid_request_error"
    assert post(server, {"file": ("a.wav", clip.read_bytes())}, headers={}).status_code == 401
    with clip.open("rb") as f:
        assert client.audio.transcriptions.create(model=MODEL, file=f, temperature=0).text
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_audio_over_the_duration_limit_is_a_400(server):
    r = post(server, {"file": ("long.mp3", encode(tone(41.0, 44100), "mp3"), "audio/mpeg")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "audio_too_long"


def test_a_speech_entry_says_what_it_serves(server, client, clip):
    with clip.open("rb") as f:  # its own transcription: the counters must not depend on which tests ran first
        client.audio.transcriptions.create(model=MODEL, file=f, temperature=0, language="en")
    with pytest.raises(openai.BadRequestError, match="speech to text only"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    status = httpx.get(server.url + "/v1/status", headers={"authorization": "Bearer sk-audio"}).json()
    assert status["speech"]["transcribes"] is True and status["speech"]["requests"] >= 1
    metrics = httpx.get(server.url + "/metrics").text
    assert f'vllmmlxd_speech_requests_total{{model="{MODEL}"}}' in metrics
    assert "vllmmlxd_speech_audio_seconds_total" in metrics and "vllmmlxd_speech_waiting" in metrics


def test_open_webuis_request_is_answered(server, clip, reference):
    """Open WebUI's speech to text with the "OpenAI" engine, as its backend sends it
    (open-webui/open-webui, backend/open_webui/routers/audio.py, commit 6adde203, the
    ``STT_ENGINE == "openai"`` branch): ``requests.post(f"{STT_OPENAI_API_BASE_URL}/audio/transcriptions",
    headers={"Authorization": f"Bearer {STT_OPENAI_API_KEY}"}, files={"file": (filename, open(path, "rb"))},
    data={"model": STT_MODEL})`` (plus ``language`` when the chat has one), then ``r.json()`` saved as the
    transcript, whose ``text`` it puts in the message box; an error body's ``error.message`` is shown."""
    with clip.open("rb") as f:
        r = requests.post(
            url=f"{server.url}/v1/audio/transcriptions",
            headers={"Authorization": "Bearer sk-audio"},
            files={"file": ("3f2a9c1e-recording.wav", f)},
            data={"model": MODEL},
            timeout=300,
        )
    r.raise_for_status()
    # Open WebUI's own default is the fallback ladder (no temperature): only the shape is checked here.
    assert isinstance(json.loads(r.text)["text"], str)
    r = requests.post(
        url=f"{server.url}/v1/audio/transcriptions",
        headers={"Authorization": "Bearer sk-audio"},
        files={"file": ("x.wav", b"not audio")},
        data={"model": MODEL, "language": "en"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["message"]
