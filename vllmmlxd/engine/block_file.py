"""One KV block as a file: the safetensors layout, with a checksum of its data in the metadata.

The layout is safetensors' own: 8 bytes of little-endian header length, a JSON header naming
each tensor's dtype, shape and byte offsets (plus ``__metadata__``, strings only), padded with
spaces to 8 bytes, then the raw bytes. So any safetensors reader can open a block, and reading
one back needs no library: the checksum (blake2b of the data section) and a check of every
offset against the file's length tell a truncated or damaged file from a good one, which is
refused as a ``BlockFileError`` rather than read into a wrong answer. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

FORMAT = "vllmmlxd-kv-block"
VERSION = "1"
MAX_HEADER = 1 << 20  # a block's header is a few hundred bytes: anything near this is not ours
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4}
ITEM_BYTES |= {"U64": 8, "I64": 8, "F64": 8}
CHECKSUM = "blake2b-128"


class BlockFileError(ValueError):
    """Not a block file of this format, or a damaged one."""


@dataclass(frozen=True)
class Tensor:
    dtype: str  # safetensors' name: F32, F16, BF16, U32...
    shape: tuple[int, ...]
    data: Any  # the raw bytes: bytes, a memoryview or a C-contiguous numpy array

    @property
    def nbytes(self) -> int:
        n = ITEM_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


def encode(tensors: dict[str, Tensor], metadata: dict[str, str]) -> list[Any]:
    """The file's parts, in order (the header, then each tensor's data), ready to be written."""
    digest = hashlib.blake2b(digest_size=16)
    header: dict[str, Any] = {}
    offset = 0
    for name, t in tensors.items():
        size = memoryview(t.data).nbytes
        if size != t.nbytes:
            raise BlockFileError(f"{name}: {size} bytes for {t.dtype}{list(t.shape)}")
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        digest.update(t.data)
        offset += size
    header["__metadata__"] = {
        **metadata,
        "format": FORMAT,
        "version": VERSION,
        "checksum": f"{CHECKSUM}:{digest.hexdigest()}",
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [struct.pack("<Q", len(text)) + text, *(t.data for t in tensors.values())]


def decode(raw: bytes | memoryview) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A file's tensors (views of ``raw``) and metadata; BlockFileError unless every check holds."""
    view = memoryview(raw)
    if len(view) < 8:
        raise BlockFileError("shorter than a header")
    (length,) = struct.unpack("<Q", view[:8])
    if length > MAX_HEADER or 8 + length > len(view):
        raise BlockFileError("header length past the end")
    try:
        header = json.loads(bytes(view[8 : 8 + length]))
    except ValueError:
        raise BlockFileError("header is not JSON") from None
    if not isinstance(header, dict):
        raise BlockFileError("header is not an object")
    metadata = header.pop("__metadata__", None)
    if (
        not isinstance(metadata, dict)
        or metadata.get("format") != FORMAT
        or metadata.get("version") != VERSION
        or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise BlockFileError("not a block of this format and version")
    data = view[8 + length :]
    tensors, end = {}, 0
    for name, info in header.items():
        try:
            dtype, shape, (begin, stop) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            tensor = Tensor(dtype, shape, data[begin:stop])
            ok = begin == end and stop - begin == tensor.nbytes and all(isinstance(d, int) and d >= 0 for d in shape)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise BlockFileError(f"tensor {name!r}: a bad dtype, shape or offsets")
        tensors[name] = tensor
        end = stop
    if end != len(data):
        raise BlockFileError(f"{len(data)} data bytes where the header says {end}")
    if metadata.get("checksum") != f"{CHECKSUM}:{hashlib.blake2b(data, digest_size=16).hexdigest()}":
        raise BlockFileError("checksum mismatch")
    return tensors, metadata
