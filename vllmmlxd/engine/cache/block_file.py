"""One KV block as a file: the safetensors layout, with a keyed checksum in the metadata.

The layout is safetensors' own: 8 bytes of little-endian header length, a JSON header naming
each tensor's dtype, shape and byte offsets (plus ``__metadata__``, strings only), padded with
spaces to 8 bytes, then the raw bytes. So any safetensors reader can open a block, and reading
one back needs no library: the checksum and a check of every offset against the file's length
tell a truncated or damaged file from a good one, which is refused as a ``BlockFileError``
rather than read into a wrong answer. The checksum is blake2b keyed with the install's secret
(``block_disk.install_secret``) over the metadata and the data: a block written by anyone who
does not hold the secret (a file planted in the directory) is refused too. Pure: bytes in,
bytes out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass
from typing import Any

FORMAT = "vllmmlxd-kv-block"
VERSION = "2"  # 2: the checksum is keyed and covers the metadata
MAX_HEADER = 1 << 20  # a block's header is a few hundred bytes: anything near this is not ours
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4}
ITEM_BYTES |= {"U64": 8, "I64": 8, "F64": 8}
CHECKSUM = "blake2b-128-keyed"


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


def _sealed(metadata: dict[str, str], key: bytes) -> Any:
    """The checksum's hash, fed the metadata first (so no field of it can be changed either)."""
    digest = hashlib.blake2b(digest_size=16, key=key)
    digest.update(json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode())
    return digest


def encode(tensors: dict[str, Tensor], metadata: dict[str, str], key: bytes = b"") -> list[Any]:
    """The file's parts, in order (the header, then each tensor's data), ready to be written;
    ``key``: the install's secret, which the checksum is keyed with."""
    fields = {**metadata, "format": FORMAT, "version": VERSION}
    digest = _sealed(fields, key)
    header: dict[str, Any] = {}
    offset = 0
    for name, t in tensors.items():
        size = memoryview(t.data).nbytes
        if size != t.nbytes:
            raise BlockFileError(f"{name}: {size} bytes for {t.dtype}{list(t.shape)}")
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        digest.update(t.data)
        offset += size
    header["__metadata__"] = {**fields, "checksum": f"{CHECKSUM}:{digest.hexdigest()}"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [struct.pack("<Q", len(text)) + text, *(t.data for t in tensors.values())]


def decode(raw: bytes | memoryview, key: bytes = b"") -> tuple[dict[str, Tensor], dict[str, str]]:
    """A file's tensors (views of ``raw``) and metadata; BlockFileError unless every check holds,
    the checksum among them (keyed with ``key``: a block sealed with another key is refused)."""
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
    digest = _sealed({k: v for k, v in metadata.items() if k != "checksum"}, key)
    digest.update(data)
    if not hmac.compare_digest(metadata.get("checksum", ""), f"{CHECKSUM}:{digest.hexdigest()}"):
        raise BlockFileError("checksum mismatch")
    return tensors, metadata
