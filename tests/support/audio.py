"""Audio files made in the test, with PyAV: a tone or noise, encoded as each upload format."""

from __future__ import annotations

import fractions
import io

import numpy as np

# (container, codec, sample rate): one per format an upload may be in.
FORMATS = {
    "wav": ("wav", "pcm_s16le", 16000),
    "mp3": ("mp3", "libmp3lame", 44100),
    "m4a": ("ipod", "aac", 44100),  # FFmpeg's muxer for .m4a
    "flac": ("flac", "flac", 44100),
    "ogg": ("ogg", "libopus", 48000),
    "webm": ("webm", "libopus", 48000),
}


def tone(seconds: float, rate: int = 16000, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def noise(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.1, int(seconds * rate)).astype(np.float32)


def encode(samples: np.ndarray, fmt: str, *, rate: int | None = None, stereo: bool = False) -> bytes:
    """``samples`` (mono float32 at ``rate``, else the format's rate) encoded as ``fmt`` (a FORMATS key)."""
    import av

    container, codec, native = FORMATS[fmt]
    rate = rate or native
    layout = "stereo" if stereo else "mono"
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        assert isinstance(stream, av.AudioStream)
        stream.layout = layout
        frame_size = stream.codec_context.frame_size or 1024
        planes = np.tile(samples, (2, 1)) if stereo else samples[None]
        for start in range(0, samples.shape[0], frame_size):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(planes[:, start : start + frame_size]), format="fltp", layout=layout
            )
            frame.sample_rate = rate
            frame.pts = start
            frame.time_base = fractions.Fraction(1, rate)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    return encode(samples, "wav", rate=rate)
