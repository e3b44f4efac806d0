"""What a worker reports of its idle time: the daemon reads 0 as "a request runs"."""

from __future__ import annotations

from vllmmlxd.http.activity import Activity


def test_zero_only_while_a_request_runs():
    """Found in a fast run: a model whose request ended 0.04 s before reported 0.0 (rounded), read as
    busy, so another lazy model's load was refused instead of unloading it for room."""
    a = Activity()
    a.last_at = 100.0
    assert a.idle_s(now=100.04) > 0 and a.idle_s(now=100.0) > 0
    assert a.idle_s(now=102.5) == 2.5
    a.in_flight = 1
    assert a.idle_s(now=102.5) == 0.0
