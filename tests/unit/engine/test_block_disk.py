"""block_disk.py and block_file.py: blocks on disk, read back only when whole, right and ours, under a budget."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from vllmmlxd.engine.cache.block_disk import DiskStore, dir_verdict
from vllmmlxd.engine.cache.block_file import BlockFileError, Tensor, decode, encode

FINGERPRINT = "ab" * 16


def tensors(seed: int, n: int = 256) -> dict[str, Tensor]:
    rng = np.random.default_rng(seed)
    return {
        "keys": Tensor("F32", (2, n), rng.standard_normal((2, n)).astype(np.float32)),
        "values": Tensor("F32", (2, n), rng.standard_normal((2, n)).astype(np.float32)),
    }


def meta(i: int) -> dict[str, str]:
    return {"parent": f"{i:032x}", "tokens": f"{i:016x}", "fingerprint": FINGERPRINT}


def expect(i: int) -> dict[str, str]:
    return {"parent": f"{i:032x}", "tokens": f"{i:016x}"}


def name(i: int) -> str:
    return f"{i:032x}"


@pytest.fixture
def store(tmp_path):
    made: list[DiskStore] = []

    def make(fingerprint: str = FINGERPRINT, budget: int = 10**9, **kw) -> DiskStore:
        made.append(DiskStore(tmp_path / "kv", fingerprint, budget, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_block_file_is_safetensors_and_round_trips(store):
    disk = store()
    assert disk.put(name(1), tensors(1), meta(1)) and disk.flush()
    path = disk.path(name(1))
    assert path.parent.parent == disk.dir and path.name == name(1) + ".safetensors"
    loaded = load_file(path)  # any safetensors reader opens it
    assert np.array_equal(loaded["keys"], tensors(1)["keys"].data)
    got = disk.get(name(1), expect(1))
    assert (
        got is not None
        and np.frombuffer(got["values"].data, np.float32).tolist() == tensors(1)["values"].data.ravel().tolist()
    )
    assert disk.stats.reads == 1 and disk.known(name(1))


def damage_data(raw: bytes) -> bytes:
    damaged = bytearray(raw)
    damaged[-5] ^= 0x40
    return bytes(damaged)


@pytest.mark.parametrize(
    "damage",
    [damage_data, lambda raw: raw[: len(raw) // 2], lambda raw: b"not a block file", lambda raw: b"\xff" * 8 + raw[8:]],
    ids=["flipped-bit", "truncated", "garbage", "bad-header-length"],
)
def test_a_damaged_file_is_a_miss_and_is_removed(store, damage):
    disk = store()
    disk.put(name(1), tensors(1), meta(1))
    disk.flush()
    path = disk.path(name(1))
    path.write_bytes(damage(path.read_bytes()))
    assert disk.get(name(1), expect(1)) is None
    assert disk.flush() and not path.exists()
    assert disk.stats.rejected == 1 and disk.stats.removed == 1 and not disk.known(name(1))


def test_a_file_of_another_block_under_this_name_is_refused(store):
    disk = store()
    disk.put(name(1), tensors(1), meta(1))
    disk.flush()
    assert disk.get(name(1), expect(2)) is None  # its tokens are not the ones asked for
    assert disk.flush() and not disk.path(name(1)).exists()


def test_another_fingerprint_never_reads_these_blocks(store):
    mine, other = store(), store(fingerprint="cd" * 16)
    mine.put(name(1), tensors(1), meta(1))
    mine.flush()
    assert other.dir != mine.dir and other.get(name(1), expect(1)) is None  # not even listed there
    # A file carried into the other's directory by hand says whose it is, and goes.
    target = other.path(name(1))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(mine.path(name(1)).read_bytes())
    assert other.get(name(1), expect(1)) is None and other.flush() and not target.exists()
    assert mine.get(name(1), expect(1)) is not None


def test_the_budget_holds_under_a_stream_of_distinct_blocks(store):
    size = sum(memoryview(p).nbytes for p in encode(tensors(0), meta(0)))
    disk = store(budget=10 * size)
    for i in range(100):
        assert disk.put(name(i), tensors(i), meta(i))
        if i % 10 == 0:
            assert disk.flush()
            assert sum(f.stat().st_size for f in disk.dir.rglob("*.safetensors")) <= disk.budget_bytes
    assert disk.flush()
    on_disk = sum(f.stat().st_size for f in disk.dir.rglob("*.safetensors"))
    assert on_disk == disk.nbytes <= disk.budget_bytes and disk.stats.evicted == 90
    assert disk.get(name(99), expect(99)) is not None and disk.get(name(0), expect(0)) is None


def test_a_block_read_recently_outlives_older_ones(store):
    size = sum(memoryview(p).nbytes for p in encode(tensors(0), meta(0)))
    disk = store(budget=3 * size)
    for i in range(3):
        disk.put(name(i), tensors(i), meta(i))
    disk.flush()
    old = time.time() - 100
    for i in range(3):
        os.utime(disk.path(name(i)), (old + i, old + i))  # 0 is the oldest...
    assert disk.get(name(0), expect(0)) is not None  # ...until it is read
    disk.put(name(3), tensors(3), meta(3))
    disk.flush()
    assert disk.path(name(0)).exists() and not disk.path(name(1)).exists()


def test_a_new_store_counts_what_is_there_and_clears_stale_temporary_files(store):
    first = store()
    for i in range(4):
        first.put(name(i), tensors(i), meta(i))
    first.flush()
    stale = first.path(name(9)).with_name("x.safetensors.123.tmp")
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"half a block")
    os.utime(stale, (time.time() - 3600,) * 2)
    second = store()
    assert second.flush() and second.nbytes == first.nbytes and not stale.exists()
    assert all(second.known(name(i)) for i in range(4))


def test_a_writer_that_falls_behind_drops_blocks_rather_than_wait(store):
    disk = store(queue_bytes=100)  # less than one block
    assert not disk.put(name(1), tensors(1), meta(1))
    assert disk.stats.dropped == 1 and disk.flush() and not disk.path(name(1)).exists()


def test_decode_refuses_what_encode_did_not_write():
    raw = b"".join(bytes(memoryview(p)) for p in encode(tensors(1), {"a": "b"}))
    got, metadata = decode(raw)
    assert metadata["a"] == "b" and got["keys"].shape == (2, 256)
    with pytest.raises(BlockFileError, match="checksum"):
        decode(damage_data(raw))
    with pytest.raises(BlockFileError):
        decode(raw + b"extra")


def test_a_directory_given_is_used_as_it_is_and_its_own_subdirectory_is_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    disk = DiskStore(shared, FINGERPRINT, 10**9)
    try:
        assert shared.stat().st_mode & 0o777 == 0o755  # never tightened: it may be the user's own
        assert disk.dir.stat().st_mode & 0o777 == 0o700
    finally:
        disk.close()


# -- the directory is trusted only as far as it is private ---------------------------------


def test_a_link_planted_where_a_block_or_a_temporary_file_goes_redirects_nothing(store, tmp_path):
    disk = store()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    path = disk.path(name(1))
    path.parent.mkdir(exist_ok=True)
    # The names a writer of the old layout used for its temporary file, and the block's own name.
    for planted in (path.with_name(f"{path.name}.{os.getpid()}.tmp"), disk.path(name(2))):
        planted.symlink_to(victim)
    disk.put(name(1), tensors(1), meta(1))
    disk.put(name(2), tensors(2), meta(2))
    assert disk.flush() and victim.read_text() == "the user's own file"
    assert path.is_file() and not path.is_symlink()


def test_a_block_behind_a_link_is_never_read_and_the_link_goes(store, tmp_path):
    disk = store()
    disk.put(name(1), tensors(1), meta(1))
    assert disk.flush()
    elsewhere = tmp_path / "elsewhere.safetensors"
    disk.path(name(1)).rename(elsewhere)  # a good block, reached only through a link
    disk.path(name(1)).symlink_to(elsewhere)
    assert disk.get(name(1), expect(1)) is None and disk.stats.rejected == 1
    assert disk.flush() and not os.path.lexists(disk.path(name(1))) and elsewhere.exists()


@pytest.mark.parametrize("key", [b"", b"k" * 32], ids=["unkeyed", "another-install"])
def test_a_forged_block_is_refused(store, key):
    disk = store()
    path = disk.path(name(1))
    path.parent.mkdir(exist_ok=True)
    forged = {**meta(1), "format": "vllmmlxd-kv-block"}
    path.write_bytes(b"".join(bytes(memoryview(p)) for p in encode(tensors(7), forged, key)))
    assert disk.get(name(1), expect(1)) is None and disk.stats.rejected == 1


def test_files_are_private_and_the_key_is_the_install_s(store, tmp_path):
    first = store()
    first.put(name(1), tensors(1), meta(1))
    assert first.flush()
    assert first.path(name(1)).stat().st_mode & 0o777 == 0o600
    assert first.path(name(1)).parent.stat().st_mode & 0o777 == 0o700
    key = tmp_path / "kv" / ".block-key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    second = store(fingerprint="cd" * 16)  # another model of the same install: the same key
    assert second.seal(b"abc") == first.seal(b"abc") != hashlib.blake2b(b"abc", digest_size=16).hexdigest()


def test_a_group_or_world_writable_directory_of_ours_is_tightened(tmp_path, caplog):
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    disk = DiskStore(root, FINGERPRINT, 10**9)
    try:
        assert root.stat().st_mode & 0o777 == 0o700
        assert "cache.disk_dir_tightened" in caplog.text
    finally:
        disk.close()


@pytest.mark.parametrize(
    "mode,owner,verdict",
    [(0o755, 1, "ok"), (0o700, 2, "ok"), (0o777, 1, "tighten"), (0o770, 1, "tighten"), (0o1777, 2, "refuse")],
)
def test_who_may_write_in_a_directory_decides_its_fate(mode, owner, verdict):
    assert dir_verdict(mode, owner, me=1) == verdict


@pytest.mark.parametrize("how", ["loose-mode", "link", "short"])
def test_a_key_file_that_is_not_private_turns_the_tier_off_with_the_reason(tmp_path, how):
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    key = root / ".block-key"
    if how == "link":
        (tmp_path / "k").write_bytes(b"k" * 32)
        key.symlink_to(tmp_path / "k")
    else:
        key.write_bytes(b"k" * (32 if how == "loose-mode" else 5))
        os.chmod(key, 0o644 if how == "loose-mode" else 0o600)
    with pytest.raises(OSError):
        DiskStore(root, FINGERPRINT, 10**9)
