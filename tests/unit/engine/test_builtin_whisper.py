"""builtin:tiny-whisper is built offline in Whisper's shape: the synthetic tokenizer puts every special
token at Whisper's own id (what mlx-audio's decoder looks up by text), WhisperProcessor loads it,
its weights are the same at every build, and mlx-audio's loader takes the folder as a Whisper model."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest

pytest.importorskip("mlx_audio")

from vllmmlxd.engine.loading.builtin import BUILTINS
from vllmmlxd.engine.loading.builtin_whisper import TINY_WHISPER_CONFIG, build_tiny_whisper, make_weights
from vllmmlxd.engine.speech.transcriber import is_speech_spec

# Whisper's multilingual layout (openai/whisper's tokenizer, n_vocab 51865).
IDS = {
    "<|endoftext|>": 50257,
    "<|startoftranscript|>": 50258,
    "<|en|>": 50259,
    "<|su|>": 50357,
    "<|translate|>": 50358,
    "<|transcribe|>": 50359,
    "<|startoflm|>": 50360,
    "<|startofprev|>": 50361,
    "<|nospeech|>": 50362,
    "<|notimestamps|>": 50363,
    "<|0.00|>": 50364,
    "<|0.02|>": 50365,
    "<|30.00|>": 51864,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-whisper")
    build_tiny_whisper(path)
    return path


def test_it_is_a_speech_builtin_and_its_folder_a_whisper_folder(folder):
    assert BUILTINS["tiny-whisper"].kind == "speech" and is_speech_spec("builtin:tiny-whisper")
    assert is_speech_spec(str(folder)) and not is_speech_spec("builtin:tiny") and not is_speech_spec(None)


def test_the_special_tokens_sit_at_whispers_ids(folder):
    from transformers import WhisperProcessor

    tokenizer = WhisperProcessor.from_pretrained(str(folder)).tokenizer
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in IDS} == IDS
    assert len(tokenizer) == TINY_WHISPER_CONFIG["n_vocab"] and tokenizer.eos_token_id == 50257
    ids = tokenizer.encode(" Hello, world", add_special_tokens=False)
    assert tokenizer.decode(ids) == " Hello, world" and max(ids) < 50257  # byte-level: any text round-trips


def test_mlx_audio_loads_it_as_a_multilingual_whisper(folder):
    from mlx_audio.stt import load  # type: ignore[import-untyped]

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a processor that failed to load would only warn
        model = load(folder)
    tok = model.get_tokenizer(language="fr", task="translate")
    assert model.is_multilingual and model.num_languages == 99 and len(tok.all_language_tokens) == 99
    assert tok.sot_sequence == (50258, 50265, 50358) and tok.no_speech == 50362 and tok.timestamp_begin == 50364


def test_the_weights_are_the_same_at_every_build():
    def digest() -> str:
        h = hashlib.sha256()
        for key, value in make_weights().items():
            h.update(key.encode() + np.ascontiguousarray(value).tobytes())
        return h.hexdigest()

    assert digest() == digest()


def test_the_memory_estimate_knows_its_size():
    from vllmmlxd.store.weights import BUILTIN_PARAMETERS

    assert sum(w.size for w in make_weights().values()) == BUILTIN_PARAMETERS["tiny-whisper"][0]
