"""How much memory a model's weights will take in a worker, read from its files alone. Stdlib only.

The daemon never imports mlx, so sizes come from safetensors and GGUF headers, the model store
(a pulled repo's copy), the Hugging Face cache and the converted folders in the state dir.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from vllmmlxd.paths import models_dir
from vllmmlxd.store.layout import MARKER as COMPLETE_MARKER
from vllmmlxd.store.layout import hub_cache_dir, hub_folder, hub_snapshot

from ..runtime.memory import MIB

__all__ = ["COMPLETE_MARKER", "hub_cache_dir", "hub_snapshot"]  # kept importable from here
HALF_DTYPES = ("F16", "BF16")
MAX_READ = 256 * MIB  # no header field is this long: a tokenizer's vocabulary is a few MB

# Parameter counts of the builtins and the bytes per parameter of their converted folders,
# for when a builtin is not converted yet. SmolLM2-135M: 30 layers of hidden 576, MLP 1536,
# 9 heads (3 for k/v), vocab 49152 with tied embeddings: 134,515,008, stored as float16 (the
# GGUF is dequantized to it). builtin:tiny, from TINY_CONFIG by hand: embeddings 49152*64 =
# 3,145,856 (49154 tokens: SmolLM2's and two thinking tokens), per layer q,o 64*64, k,v 32*64, gate,up,down 128*64, norms 2*64 = 36,992 (two
# layers), final norm 64: 3,219,904, stored as float32.
# builtin:tiny-vlm: every tensor of engine/loading/builtin_vlm.py's SmolVLM (its decoder as tiny's with an
# untied output layer and 40 image tokens more, a 1-layer SigLIP of 32, the connector), float32.
# builtin:all-minilm-l6-v2: the F32 tensors of its safetensors file (BERT, 6 layers of 384, vocab
# 30522, its pooler included), stored and run as float32.
BUILTIN_PARAMETERS = {
    "smollm2-135m-instruct": (134_515_008, 2),
    "tiny": (3_219_904, 4),
    "tiny-vlm": (6_395_904, 4),
    "all-minilm-l6-v2": (22_713_216, 4),
    "tiny-whisper": (3_584_576, 2),  # mlx-audio runs Whisper in float16
}


# -- a model's weights ---------------------------------------------------------


@dataclass(frozen=True)
class WeightsEstimate:
    """The bytes a model's weights take once loaded (None: unknown), and how that was found."""

    nbytes: int | None
    source: str


def estimate_weights(spec: str, state_dir: Path, *, cpu: bool) -> WeightsEstimate:
    """What the weights of a ``model:`` spec will take in a worker, from its files alone.

    Follows the loader's order: ``builtin:NAME``, a ``.gguf`` file, a folder with
    config.json, else a Hugging Face repo id (the store's copy, else the hub cache's; unknown until
    it is downloaded).
    """
    if spec.startswith("builtin:"):
        return _builtin_weights(spec[len("builtin:") :], state_dir, cpu)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            return WeightsEstimate(None, "file not found")
        try:
            params = gguf_parameters(path)
        except (OSError, ValueError) as exc:
            return WeightsEstimate(None, f"unreadable GGUF: {exc}")
        # Dequantized to float16 when converted; the CPU backend then runs it in float32.
        return WeightsEstimate(params * (4 if cpu else 2), f"GGUF, {params / 1e6:.1f}M parameters")
    if path.is_dir():
        found = folder_weights(path, cpu)
        return found or WeightsEstimate(None, "no *.safetensors in the folder")
    if path.exists():
        return WeightsEstimate(None, "not a model file or folder")
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1:  # only a path could mean it, as in the loader
        return WeightsEstimate(None, "not found")
    snapshot = hub_folder(spec, state_dir)
    found = folder_weights(snapshot, cpu) if snapshot is not None else None
    return found or WeightsEstimate(None, "not downloaded yet")


def estimate_entry_weights(
    model: str, embedding_model: str | None, state_dir: Path, *, cpu: bool, draft_model: str | None = None
) -> WeightsEstimate:
    """An entry's weights: its model's, plus its embedding model's and its speculative draft model's
    when it has them (loaded in the same worker)."""
    total = estimate_weights(model, state_dir, cpu=cpu)
    for label, spec in (("embedding model", embedding_model), ("draft model", draft_model)):
        if not spec:
            continue
        extra = estimate_weights(spec, state_dir, cpu=cpu)
        if total.nbytes is None or extra.nbytes is None:
            total = WeightsEstimate(total.nbytes, f"{total.source}; {label}: {extra.source}")
        else:
            total = WeightsEstimate(total.nbytes + extra.nbytes, f"{total.source} + {label} ({extra.source})")
    return total


def _builtin_weights(name: str, state_dir: Path, cpu: bool) -> WeightsEstimate:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        return WeightsEstimate(None, "unknown builtin")
    # The newest complete converted folder beats the constant (engine/loading/builtin.py versions them).
    built = sorted(models_dir(state_dir).glob(f"builtin-{name}-v*/{COMPLETE_MARKER}"), key=lambda p: _version(p.parent))
    found = folder_weights(built[-1].parent, cpu) if built else None
    if found is not None:
        return WeightsEstimate(found.nbytes, f"converted, {found.source}")
    if name not in BUILTIN_PARAMETERS:
        return WeightsEstimate(None, "unknown builtin")
    params, width = BUILTIN_PARAMETERS[name]
    return WeightsEstimate(params * (4 if cpu else width), "known size (not converted yet)")


def _version(folder: Path) -> int:
    tail = folder.name.rpartition("-v")[2]
    return int(tail) if tail.isdigit() else -1


def folder_weights(folder: Path, cpu: bool) -> WeightsEstimate | None:
    """The sum of a model folder's ``*.safetensors``; on the CPU backend an unquantized model's
    16-bit tensors count twice (the loader runs them in float32). None without safetensors."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:
        total = sum(f.stat().st_size for f in files)
    except OSError:
        return None
    if not cpu:
        return WeightsEstimate(total, "safetensors")
    config = _read_json(folder / "config.json")
    if "quantization" in config:
        return WeightsEstimate(total, "safetensors, quantized")
    try:
        half = sum(safetensors_half_bytes(f) for f in files)
    except (OSError, ValueError):
        # The header is unreadable: trust config.json's dtype instead.
        half = total if config.get("torch_dtype") in ("float16", "bfloat16") else 0
    if half:
        return WeightsEstimate(total + half, "safetensors, 16-bit loaded as float32")
    return WeightsEstimate(total, "safetensors")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def safetensors_half_bytes(path: Path) -> int:
    """Bytes of float16/bfloat16 tensors in a safetensors file, from its JSON header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", _read(f, 8))
        header = json.loads(_read(f, size))
    return sum(
        t["data_offsets"][1] - t["data_offsets"][0]
        for name, t in header.items()
        if name != "__metadata__" and t.get("dtype") in HALF_DTYPES
    )


LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # as mlx-lm's sharded_load tells a layer's tensors


def layer_bytes(folder: Path) -> tuple[int, dict[int, int]] | None:
    """A folder's safetensors bytes outside the layers (embeddings, norm, head) and per layer index,
    from the headers: what a rank of a split model holds. None when a header cannot be read."""
    outside, per_layer = 0, {}  # type: tuple[int, dict[int, int]]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:
        for path in files:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", _read(f, 8))
                header = json.loads(_read(f, size))
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                n = t["data_offsets"][1] - t["data_offsets"][0]
                m = LAYER_RE.search(name)
                if m is None:
                    outside += n
                else:
                    per_layer[int(m.group(1))] = per_layer.get(int(m.group(1)), 0) + n
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return outside, per_layer


def model_folder(spec: str, state_dir: Path) -> Path | None:
    """The MLX folder a spec names, where it is on disk already (a converted builtin, a folder, the
    store's copy of a hub repo, the hub cache)."""
    if spec.startswith("builtin:"):
        name = spec[len("builtin:") :]
        built = sorted(
            models_dir(state_dir).glob(f"builtin-{name}-v*/{COMPLETE_MARKER}"), key=lambda p: _version(p.parent)
        )
        return built[-1].parent if built else None
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if spec.lower().endswith(".gguf") or path.exists():
        return None
    return hub_folder(spec, state_dir)


# -- GGUF headers ------------------------------------------------------------------

# GGUF metadata value types: fixed-size scalars by struct format, then string (8) and array (9).
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_parameters(path: Path) -> int:
    """The number of weights in a GGUF file: the product of each tensor's dims, from its header."""
    with open(path, "rb") as f:
        return read_gguf_parameters(f)


def read_gguf_parameters(f: BinaryIO) -> int:
    """:func:`gguf_parameters` over an open file; ValueError when it is not GGUF v2 or v3."""
    if _read(f, 4) != b"GGUF":
        raise ValueError("not a GGUF file")
    (version,) = struct.unpack("<I", _read(f, 4))
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
    for _ in range(n_kv):
        _skip_string(f)
        _skip_value(f, struct.unpack("<I", _read(f, 4))[0])
    total = 0
    for _ in range(n_tensors):
        _skip_string(f)
        (n_dims,) = struct.unpack("<I", _read(f, 4))
        dims = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims))
        _read(f, 12)  # the tensor's type (u32) and data offset (u64)
        total += math.prod(dims)
    return total


def _read(f: BinaryIO, n: int) -> bytes:
    if n > MAX_READ:  # a corrupt length must not become a huge allocation
        raise ValueError(f"implausible length {n} in the header")
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated header")
    return data


def _skip_string(f: BinaryIO) -> None:
    (length,) = struct.unpack("<Q", _read(f, 8))
    _read(f, length)


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind in _GGUF_SCALARS:
        _read(f, struct.calcsize(_GGUF_SCALARS[kind]))
    elif kind == _GGUF_STRING:
        _skip_string(f)
    elif kind == _GGUF_ARRAY:
        item, count = struct.unpack("<IQ", _read(f, 12))
        if item in _GGUF_SCALARS:
            _read(f, count * struct.calcsize(_GGUF_SCALARS[item]))
        else:
            for _ in range(count):
                _skip_value(f, item)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")
