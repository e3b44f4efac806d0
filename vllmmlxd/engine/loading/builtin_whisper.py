"""``builtin:tiny-whisper``: random weights in Whisper's shape with a synthetic tokenizer, built offline.

Whisper's real BPE is not available offline, so the tokenizer is byte-level BPE made here:
the 256 byte symbols, then merges of byte pairs up to Whisper's 50257 base ids, then Whisper's
special tokens at their real ids (end of text, start of transcript, 99 languages, task tokens,
no-speech, no-timestamps, the 1501 timestamps). The ids are what matter: mlx-audio's decoder
finds every special token by its text, and the multilingual layout follows from n_vocab 51865.
The weights are N(0, 0.02) from ``default_rng(0)`` (norms 1, biases 0): the same on every
platform. What it transcribes is noise; it exists to test the serving path and measure speed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

N_BASE = 50257  # Whisper's byte-level BPE ids before the special tokens
TIMESTAMP_BEGIN = 50364  # <|0.00|>
TEXT_EMBEDDING_GAIN = 25.0  # text and special token rows: N(0, 0.5)
TINY_WHISPER_CONFIG: dict[str, Any] = {
    "model_type": "whisper",
    "n_mels": 80,
    "n_audio_ctx": 1500,  # 30 s of audio: 3000 mel frames halved by the second conv
    "n_audio_state": 64,
    "n_audio_head": 2,
    "n_audio_layer": 2,
    "n_vocab": 51865,  # multilingual: 99 languages
    "n_text_ctx": 64,  # decoding stops at 32 tokens a window (random weights rarely end one sooner): tests stay quick
    "n_text_state": 64,
    "n_text_head": 2,
    "n_text_layer": 2,
}
# Whisper's language codes in its token order: the first 99 (the 100th, yue, came with large-v3).
LANGUAGE_CODES = (
    "en",
    "zh",
    "de",
    "es",
    "ru",
    "ko",
    "fr",
    "ja",
    "pt",
    "tr",
    "pl",
    "ca",
    "nl",
    "ar",
    "sv",
    "it",
    "id",
    "hi",
    "fi",
    "vi",
    "he",
    "uk",
    "el",
    "ms",
    "cs",
    "ro",
    "da",
    "hu",
    "ta",
    "no",
    "th",
    "ur",
    "hr",
    "bg",
    "lt",
    "la",
    "mi",
    "ml",
    "cy",
    "sk",
    "te",
    "fa",
    "lv",
    "bn",
    "sr",
    "az",
    "sl",
    "kn",
    "et",
    "mk",
    "br",
    "eu",
    "is",
    "hy",
    "ne",
    "mn",
    "bs",
    "kk",
    "sq",
    "sw",
    "gl",
    "mr",
    "pa",
    "si",
    "km",
    "sn",
    "yo",
    "so",
    "af",
    "oc",
    "ka",
    "be",
    "tg",
    "sd",
    "gu",
    "am",
    "yi",
    "lo",
    "uz",
    "fo",
    "ht",
    "ps",
    "tk",
    "nn",
    "mt",
    "sa",
    "lb",
    "my",
    "bo",
    "tl",
    "mg",
    "as",
    "tt",
    "haw",
    "ln",
    "ha",
    "ba",
    "jw",
    "su",
)


def special_tokens() -> list[str]:
    """Whisper's special tokens in id order from 50257: they end at id 51864."""
    head = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in LANGUAGE_CODES)]
    tasks = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    stamps = [f"<|{i // 50}.{i % 50 * 2:02d}|>" for i in range(1501)]  # 0.00 .. 30.00 by 0.02
    return head + tasks + stamps


def byte_symbols() -> list[str]:
    """The printable stand-in of each byte, as GPT-2's byte-level BPE maps them (tokenizers' ByteLevel)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def make_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The base vocabulary (bytes, then byte pairs) and its merges: 50257 ids."""
    symbols = byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols)}
    merges: list[tuple[str, str]] = []
    # Letters and the space symbol first, so random ids decode to word-like text.
    order = sorted(symbols, key=lambda s: (not ((s.isalpha() and s.isascii()) or s == "Ġ"), ord(s)))
    for a in order:
        for b in order:
            if len(vocab) == N_BASE:
                return vocab, merges
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    return vocab, merges


def write_tokenizer(folder: Path) -> None:
    """tokenizer.json, its config and the feature extractor's config, as WhisperProcessor loads them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = make_vocab()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens()])
    assert tok.get_vocab_size() == TINY_WHISPER_CONFIG["n_vocab"]  # the last timestamp is id 51864
    tok.save(str(folder / "tokenizer.json"))
    eot = "<|endoftext|>"
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "WhisperTokenizer",
            "bos_token": eot,
            "eos_token": eot,
            "unk_token": eot,
            "pad_token": eot,
            "model_max_length": TINY_WHISPER_CONFIG["n_text_ctx"],
            "add_prefix_space": False,
        },
    )
    _write_json(
        folder / "preprocessor_config.json",
        {
            "feature_extractor_type": "WhisperFeatureExtractor",
            "processor_class": "WhisperProcessor",
            "feature_size": TINY_WHISPER_CONFIG["n_mels"],
            "sampling_rate": 16000,
            "hop_length": 160,
            "chunk_length": 30,
            "n_fft": 400,
            "n_samples": 480000,
            "nb_max_frames": 3000,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": False,
        },
    )


def make_weights(config: dict[str, Any] = TINY_WHISPER_CONFIG) -> dict[str, np.ndarray]:
    """The float32 weights, in mlx-audio's own key names and shapes, in a fixed order."""
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions  # type: ignore[import-untyped]

    params = tree_flatten(Model(ModelDimensions.from_dict(config), mx.float32).parameters())
    assert isinstance(params, list)  # a tree of arrays flattens to (key, array) pairs
    shapes = {key: value.shape for key, value in params}
    rng = np.random.default_rng(0)
    weights = {}
    for key in sorted(shapes):
        shape = shapes[key]
        if key.endswith("ln.weight") or key.endswith("ln_post.weight") or key.endswith("_ln.weight"):
            weights[key] = np.ones(shape, np.float32)
        elif key.endswith(".bias"):
            weights[key] = np.zeros(shape, np.float32)
        else:
            weights[key] = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    # Text rows far louder than the timestamps': at N(0, 0.02) for all, the 1501 timestamps together
    # outweigh any text token, every step is forced to a timestamp and decoding degenerates.
    weights["decoder.token_embedding.weight"][:TIMESTAMP_BEGIN] *= TEXT_EMBEDDING_GAIN
    return weights


def build_tiny_whisper(folder: Path) -> None:
    """Fill ``folder`` with builtin:tiny-whisper: config, weights, tokenizer, feature extractor config."""
    _write_json(folder / "config.json", TINY_WHISPER_CONFIG)
    weights = {k: mx.array(v) for k, v in make_weights().items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_tokenizer(folder)
    # The last decoder layer's heads align words to audio (mlx-audio's default, written out).
    heads = [[TINY_WHISPER_CONFIG["n_text_layer"] - 1, h] for h in range(TINY_WHISPER_CONFIG["n_text_head"])]
    _write_json(folder / "generation_config.json", {"alignment_heads": heads, "is_multilingual": True})


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
