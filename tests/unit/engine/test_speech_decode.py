"""Uploads decoded with PyAV: every format an upload may be in, made here from a tone, comes back as
16 kHz mono float32 of the tone's length; bytes that are no audio, an empty file, a file over
the size limit and audio over the duration limit are the client's errors, naming the problem."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.audio import FORMATS, encode, noise, tone, wav
from vllmmlxd.engine.speech.decode import SAMPLE_RATE, AudioLimits, decode_audio
from vllmmlxd.errors import InvalidRequest, PayloadTooLarge

pytest.importorskip("av")
LIMITS = AudioLimits(max_bytes=25 * 1024 * 1024, max_seconds=60)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_upload_format_decodes_to_16k_mono_float32(fmt):
    samples = decode_audio(encode(tone(2.0, FORMATS[fmt][2]), fmt, stereo=fmt == "mp3"), LIMITS)
    assert samples.dtype == np.float32 and samples.ndim == 1
    # Lossy codecs pad or trim a frame at the ends: the length is the tone's within 50 ms.
    assert abs(samples.size - 2 * SAMPLE_RATE) <= SAMPLE_RATE // 20
    middle = samples[SAMPLE_RATE // 2 : SAMPLE_RATE]
    assert 0.15 < float(np.abs(middle).max()) < 0.7  # the tone, not silence (stereo is downmixed)


def test_a_16k_mono_wav_decodes_to_its_own_samples():
    source = noise(1.0)
    assert np.allclose(decode_audio(wav(source), LIMITS), source, atol=1 / 32768)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"this is a text file, not audio\n" * 20, "could not be decoded as audio"),
        (b"", "empty"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "could not be decoded as audio"),
    ],
)
def test_bytes_that_are_no_audio_are_a_400_naming_the_problem(data, problem):
    with pytest.raises(InvalidRequest) as info:
        decode_audio(data, LIMITS)
    assert problem in info.value.message and info.value.param == "file"
    assert info.value.status_code == 400


def test_a_file_over_the_size_limit_is_a_413_naming_the_limit():
    data = wav(noise(1.0))
    with pytest.raises(PayloadTooLarge) as info:
        decode_audio(data, AudioLimits(max_bytes=len(data) - 1, max_seconds=60))
    assert info.value.status_code == 413 and "max_audio_mb" in info.value.message


def test_audio_over_the_duration_limit_is_a_400_before_all_of_it_is_decoded():
    with pytest.raises(InvalidRequest) as info:
        decode_audio(wav(noise(3.0)), AudioLimits(max_bytes=LIMITS.max_bytes, max_seconds=2.0))
    assert info.value.code == "audio_too_long" and "max_audio_s" in info.value.message
    assert decode_audio(wav(noise(2.0)), AudioLimits(max_bytes=LIMITS.max_bytes, max_seconds=2.0)).size == 32000
