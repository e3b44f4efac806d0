"""Which model and KV layout wrote a block on disk: a cheap fingerprint of the weights and the layout.

Not a hash of the whole weights: reading a 40 GB model at disk speed would add most of a minute
to every worker start, to protect against a change no real edit makes. What is read instead
tells apart what does change: each weights file's name and size, a safetensors file's whole
header (every tensor's name, dtype, shape and offsets: another model, quantization or
conversion differs there), the first and last MiB of each file (a fine-tune of the same shape
differs in its bytes from the first tensors on), and config.json. The same files downloaded
again give the same fingerprint, so the disk tier survives a re-download. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

EDGE_BYTES = 1 << 20  # read from each end of a weights file
WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf", ".bin")
MAX_SAFETENSORS_HEADER = 100 * 1024**2


def weights_fingerprint(folder: Path) -> str:
    """The fingerprint of the model folder's weights files and config.json; FileNotFoundError if it has no weights."""
    files = sorted(
        p for p in Path(folder).iterdir() if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")
    )
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"no weights files in {folder}")
    digest = hashlib.blake2b(digest_size=16)
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with open(path, "rb") as f:
            if path.name == "config.json":
                digest.update(f.read())
                continue
            if path.suffix == ".safetensors" and size >= 8:
                (length,) = struct.unpack("<Q", f.read(8))
                digest.update(f.read(min(length, MAX_SAFETENSORS_HEADER)))
            f.seek(0)
            digest.update(f.read(EDGE_BYTES))
            f.seek(max(size - EDGE_BYTES, 0))
            digest.update(f.read(EDGE_BYTES))
    return digest.hexdigest()


def cache_fingerprint(weights: str, layout: dict) -> str:
    """The disk tier's directory name: the weights' fingerprint and every fact of the KV layout."""
    text = json.dumps({"weights": weights, **layout}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
