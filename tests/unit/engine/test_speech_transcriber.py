"""The speech thread: the request's options as mlx-audio's keywords (a given temperature the only
one tried, none given leaving Whisper's ladder), a full queue refused at once with 503, and a
request that fails failing alone while the thread serves the next."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.support.audio import noise
from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.engine.speech.transcriber import (
    SpeechRequest,
    Transcriber,
    generate_options,
    is_speech_spec,
    is_whisper_config,
)
from vllmmlxd.errors import Overloaded


def test_a_given_temperature_is_the_only_one_and_none_leaves_the_ladder():
    samples = np.zeros(16000, np.float32)
    assert generate_options(SpeechRequest(samples, temperature=0))["temperature"] == 0.0
    ladder = generate_options(SpeechRequest(samples, prompt="", language="fr", task="translate"))
    assert "temperature" not in ladder and ladder["initial_prompt"] is None
    assert ladder["language"] == "fr" and ladder["task"] == "translate" and ladder["verbose"] is None


def test_whisper_configs_of_both_kinds_are_recognised():
    assert is_whisper_config({"model_type": "whisper"})
    assert is_whisper_config({"n_mels": 80, "n_audio_ctx": 1500, "n_text_ctx": 448})
    assert not is_whisper_config({"model_type": "llama"})


def test_a_pulled_repo_id_is_a_speech_spec_by_its_stores_copy(tmp_path):
    from vllmmlxd.paths import models_dir
    from vllmmlxd.store.layout import MARKER, folder_name

    folder = models_dir(tmp_path) / folder_name("mlx-community/whisper-tiny")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "whisper"}')
    assert not is_speech_spec("mlx-community/whisper-tiny", tmp_path)  # not complete: no marker yet
    (folder / MARKER).write_text("{}")
    assert is_speech_spec("mlx-community/whisper-tiny", tmp_path)
    assert not is_speech_spec("mlx-community/whisper-tiny")  # without the state dir: nothing to look in
    assert not is_speech_spec("mlx-community/other-model", tmp_path)


@pytest.fixture(scope="module")
def transcriber(state_dir):
    t = Transcriber(ensure_builtin("tiny-whisper", state_dir), name="w", source="builtin:tiny-whisper", max_queue=1)
    yield t
    t.close()


def test_a_full_queue_is_a_503_at_once(transcriber):
    transcriber.stats.waiting = 1
    try:
        with pytest.raises(Overloaded, match="max_queue 1"):
            asyncio.run(transcriber.transcribe(SpeechRequest(noise(1.0), temperature=0)))
    finally:
        transcriber.stats.waiting = 0


def test_a_failing_request_fails_alone_and_the_thread_serves_the_next(transcriber):
    async def both():
        with pytest.raises(Exception):  # noqa: B017 - whatever mlx-audio raises for samples of no shape
            await transcriber.transcribe(SpeechRequest(np.zeros((2, 2, 2), np.float32), temperature=0))
        return await transcriber.transcribe(SpeechRequest(noise(1.0), temperature=0, language="en"))

    transcript = asyncio.run(both())
    assert transcript.duration == 1.0 and transcript.language == "en"
    assert transcriber.stats.errors == 1 and transcriber.stats.requests == 1


def test_without_the_audio_extra_a_speech_entry_names_what_to_install(monkeypatch, tmp_path):
    from vllmmlxd import extras
    from vllmmlxd.engine.speech.transcriber import load_transcriber
    from vllmmlxd.errors import ModelLoadError

    monkeypatch.setattr(extras, "find_spec", lambda name: None)  # as on a plain `pip install vllmmlxd`
    with pytest.raises(ModelLoadError, match=r"pip install 'vllmmlxd\[audio\]'"):
        load_transcriber("builtin:tiny-whisper", tmp_path, name="w")
