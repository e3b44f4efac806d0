"""The disk tier of the block cache: block files in a directory of their own model and KV layout.

Files live under ``ROOT/FINGERPRINT/xx/NAME.safetensors``: the fingerprint names the model's
weights and the KV layout (``fingerprint.py``), so another model, dtype or quantization never
even lists these files; NAME is a block's chain digest (its parent's and its tokens'), so a
lookup that runs out of blocks in memory goes on by opening the next block's name.

Two threads, one writer. The engine thread reads (a lookup) and hands over new blocks as host
bytes it already copied (MLX arrays are evaluated on the engine thread only); it never waits on
the disk: a write that would overfill the hand-over (``QUEUE_BYTES``) is dropped and counted.
The writer thread alone writes and deletes files and keeps the budget: each file is written
under a temporary name and renamed (a crash leaves no half file under a real name), the budget
is least recently used first by mtime (a read touches its file), and the sizes are scanned at
start and every ``RESCAN_S`` (another worker of the same model, during a swap, writes here too).
A file that fails a check when read (truncated, damaged, foreign) is a miss, and goes to the
writer to be removed. No mlx here: tensors are bytes (``block_file``).
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ..log import log_event
from .block_file import BlockFileError, Tensor, decode, encode

logger = logging.getLogger("vllmmlxd.engine")

SUFFIX = ".safetensors"
QUEUE_BYTES = 256 * 1024**2  # host copies waiting for the writer at most; past that, new blocks are not written
RESCAN_S = 60.0
STALE_TMP_S = 600.0  # a temporary file this old was left by a writer that died


@dataclass
class DiskStats:
    reads: int = 0  # blocks read back (engine thread)
    read_bytes: int = 0
    rejected: int = 0  # files that failed a check when read (engine thread)
    written: int = 0  # blocks written (writer thread, as the rest)
    write_bytes: int = 0
    dropped: int = 0  # blocks not handed over: the writer was behind (engine thread)
    evicted: int = 0
    removed: int = 0  # rejected files deleted
    errors: int = 0  # writes that failed (a full disk...)


class DiskStore:
    def __init__(
        self,
        root: Path,
        fingerprint: str,
        budget_bytes: int,
        *,
        queue_bytes: int = QUEUE_BYTES,
        rescan_s: float = RESCAN_S,
    ):
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.dir = self.root / fingerprint
        self.budget_bytes = budget_bytes
        self.queue_bytes = queue_bytes
        self.rescan_s = rescan_s
        self.stats = DiskStats()
        # Created private; an existing directory is left as it is (it may be one the user shares).
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The writer's state: the files it knows and their sizes, an LRU heap by mtime, the total.
        self._index: dict[str, int] = {}
        self._heap: list[tuple[float, str]] = []
        self.nbytes = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._rejected: deque[str] = deque(maxlen=4096)  # names the engine thread found bad
        self._handed = 0  # bytes handed over (engine thread) ...
        self._done = 0  # ... and taken care of (writer thread)
        self._scanned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="kv-disk-writer", daemon=True)
        self._thread.start()

    def path(self, name: str) -> Path:
        return self.dir / name[:2] / (name + SUFFIX)

    def known(self, name: str) -> bool:
        """Whether the block is on disk as far as the writer knows (a read of its index: may lag)."""
        return name in self._index

    # -- the engine thread ------------------------------------------------

    def get(self, name: str, expect: dict[str, str]) -> dict[str, Tensor] | None:
        """The block ``name``'s tensors, if its file is here and passes every check (its metadata
        must hold ``expect``); a bad file is a miss and is removed."""
        path = self.path(name)
        try:
            raw = path.read_bytes()
        except OSError:
            return None  # not there (or gone meanwhile: another worker's writer evicted it)
        try:
            tensors, meta = decode(raw)
            wrong = [k for k, v in {"fingerprint": self.fingerprint, **expect}.items() if meta.get(k) != v]
            if wrong:
                raise BlockFileError(f"not this block: {', '.join(wrong)} differ")
        except BlockFileError as exc:
            self.reject(name, str(exc))
            return None
        try:
            os.utime(path)  # recently used: the writer's budget keeps it longer
        except OSError:
            pass
        self.stats.reads += 1
        self.stats.read_bytes += len(raw)
        return tensors

    def reject(self, name: str, why: str) -> None:
        """A file found bad: counted, logged, and removed by the writer."""
        self.stats.rejected += 1
        log_event(logger, "cache.disk_rejected", logging.WARNING, block=name, reason=why)
        self._rejected.append(name)
        self._jobs.put(("wake",))

    def room(self, nbytes: int) -> bool:
        """Whether the writer can take ``nbytes`` more now; counts a drop when it cannot (asked before
        the host copy is made, so a writer that fell behind costs the engine thread nothing)."""
        if self._handed - self._done + nbytes > self.queue_bytes:
            self.stats.dropped += 1
            return False
        return True

    def put(self, name: str, tensors: dict[str, Tensor], metadata: dict[str, str]) -> bool:
        """Hand a block's bytes to the writer; False (dropped) when it is too far behind."""
        size = sum(t.nbytes for t in tensors.values())
        if not self.room(size):
            return False
        self._handed += size
        self._jobs.put(("write", name, tensors, metadata, size))
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the writer has done everything handed over so far (tests, shutdown)."""
        done = threading.Event()
        self._jobs.put(("flush", done))
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what was handed over (within ``timeout``), then stop the writer."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)

    def describe(self) -> dict:
        s = self.stats
        return {
            "dir": str(self.dir),
            "budget_mb": round(self.budget_bytes / 1024**2, 1),
            "used_mb": round(self.nbytes / 1024**2, 3),
            "files": len(self._index),
            "blocks_read": s.reads,
            "blocks_written": s.written,
            "rejected": s.rejected,
            "dropped": s.dropped,
            "evicted": s.evicted,
            "write_errors": s.errors,
        }

    # -- the writer thread ------------------------------------------------

    def _run(self) -> None:
        self._scan()
        while True:
            try:
                job = self._jobs.get(timeout=self.rescan_s)
            except queue.Empty:
                job = ("wake",)
            while self._rejected:
                self._remove(self._rejected.popleft(), counted=True)
            if job is None:
                return
            try:
                self._do(job)
            except Exception as exc:  # the tier is an optimisation: a surprise costs a block, not the writer
                self.stats.errors += 1
                log_event(logger, "cache.disk_error", logging.WARNING, error=repr(exc))

    def _do(self, job: tuple) -> None:
        kind = job[0]
        if kind == "write":
            _, name, tensors, metadata, size = job
            try:
                self._write(name, tensors, metadata)
            finally:
                self._done += size
        elif kind == "flush":
            job[1].set()
        if time.monotonic() - self._scanned_at > self.rescan_s:
            self._scan()

    def _scan(self) -> None:
        """Every block file's size and mtime, from the directory itself; stale temporary files removed."""
        index: dict[str, int] = {}
        heap: list[tuple[float, str]] = []
        now = time.time()
        try:
            shards = list(os.scandir(self.dir))
        except OSError:
            shards = []
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(shard.path))
            except OSError:
                continue
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.endswith(SUFFIX):
                    name = entry.name[: -len(SUFFIX)]
                    index[name] = info.st_size
                    heap.append((info.st_mtime, name))
                elif entry.name.endswith(".tmp") and now - info.st_mtime > STALE_TMP_S:
                    _unlink(Path(entry.path))
        heapq.heapify(heap)
        self._index, self._heap, self.nbytes = index, heap, sum(index.values())
        self._scanned_at = time.monotonic()
        self._keep_budget()

    def _write(self, name: str, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        path = self.path(name)
        if name in self._index or path.exists():
            return  # written before (by this worker, or another of the same model)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            parts = encode(tensors, metadata)
            with open(tmp, "wb") as f:
                for part in parts:
                    f.write(part)
            os.replace(tmp, path)
            info = path.stat()
        except (OSError, BlockFileError) as exc:
            _unlink(tmp)
            self.stats.errors += 1
            log_event(logger, "cache.disk_write_failed", logging.WARNING, block=name, error=repr(exc))
            return
        self._index[name] = info.st_size
        self.nbytes += info.st_size
        heapq.heappush(self._heap, (info.st_mtime, name))
        self.stats.written += 1
        self.stats.write_bytes += info.st_size
        self._keep_budget()

    def _keep_budget(self) -> None:
        """Delete least recently used files until the rest fit; a file read since it was queued goes back."""
        while self.nbytes > self.budget_bytes and self._heap:
            mtime, name = heapq.heappop(self._heap)
            if name not in self._index:
                continue
            try:
                now = self.path(name).stat().st_mtime
            except OSError:
                self.nbytes -= self._index.pop(name)  # removed by someone else
                continue
            if now > mtime:
                heapq.heappush(self._heap, (now, name))  # touched by a read since
                continue
            self._remove(name, counted=False)
            self.stats.evicted += 1

    def _remove(self, name: str, *, counted: bool) -> None:
        _unlink(self.path(name))
        self.nbytes -= self._index.pop(name, 0)
        if counted:
            self.stats.removed += 1


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
