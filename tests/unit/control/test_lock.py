"""lock.py: one daemon per state directory and per control socket."""

from __future__ import annotations

import os

import pytest

from vllmmlxd.control.lock import DaemonLock, DaemonRunning


def test_a_second_daemon_is_refused_on_the_same_state_dir_or_socket_and_admitted_after(tmp_path):
    state, sock = tmp_path / "state", tmp_path / "run" / "control.sock"
    state.mkdir()
    first = DaemonLock.acquire(state, sock)
    with pytest.raises(DaemonRunning, match=rf"pid {os.getpid()}\) is running on the state directory"):
        DaemonLock.acquire(state, sock)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(DaemonRunning, match="control socket"):
        DaemonLock.acquire(other, sock)
    DaemonLock.acquire(other, tmp_path / "elsewhere.sock").release()  # the other state dir was let go
    first.release()
    DaemonLock.acquire(state, sock).release()
