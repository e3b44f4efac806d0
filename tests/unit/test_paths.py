"""The state dir is private (0700) and one daemon at a time holds its lock."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllmmlxd.paths import AlreadyRunning, acquire_lock, ensure_private_dir


def mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_a_new_state_dir_is_0700_parents_included(tmp_path):
    target = ensure_private_dir(tmp_path / "a" / "state")
    assert target.is_dir() and mode(target) == 0o700


def test_an_existing_loose_dir_we_own_is_tightened(tmp_path):
    loose = tmp_path / "state"
    loose.mkdir()
    os.chmod(loose, 0o755)
    ensure_private_dir(loose)
    assert mode(loose) == 0o700


def test_the_lock_holds_our_pid_and_a_second_taker_is_told_who_holds_it(tmp_path):
    path = tmp_path / "daemon.lock"
    held = acquire_lock(path)
    assert path.read_text().strip() == str(os.getpid()) and mode(path) == 0o600
    # flock locks belong to the open file: a second open, even in this process, is refused.
    with pytest.raises(AlreadyRunning) as info:
        acquire_lock(path)
    assert info.value.pid == os.getpid() and str(os.getpid()) in str(info.value) and str(path) in str(info.value)
    held.close()
    again = acquire_lock(path)  # released on close: a stale file never blocks
    again.close()


def test_the_lock_is_released_when_its_holder_dies(tmp_path):
    path = tmp_path / "daemon.lock"
    code = f"from vllmmlxd.paths import acquire_lock; acquire_lock({str(path)!r}); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    acquire_lock(path).close()
