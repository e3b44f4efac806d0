"""What the e2e tests share: a real daemon on a temporary config, stopped after the test with no
worker left behind (files with other needs define their own ``daemon``)."""

from __future__ import annotations

import pytest

from tests.support.daemon import make_daemon, wait_gone


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    code = d.stop()
    pids = [p for p in d.worker_pids()] if d.proc and d.proc.poll() is None else []
    assert wait_gone(pids)
    if code not in (0, None, -9):
        pytest.fail(f"daemon exited {code}:\n{d.log()[-3000:]}")
