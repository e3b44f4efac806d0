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


def test_a_requests_keep_alive_is_reported_and_replaces_the_entrys_limit():
    from vllmmlxd.http.activity import KEEP_FOREVER, idle_limit

    a = Activity()
    assert "keep_alive_s" not in a.load()
    a.keep_alive(0.0)
    assert a.load()["keep_alive_s"] == 0.0
    a.keep_alive(None)  # a later request that says nothing: the entry's own again
    assert "keep_alive_s" not in a.load()
    assert idle_limit(300, None) == 300 and idle_limit(None, None) is None
    assert idle_limit(300, 0.0) == 0.0 and idle_limit(None, 60.0) == 60.0 and idle_limit(300, KEEP_FOREVER) is None


def test_asking_what_is_loaded_is_no_use():
    from vllmmlxd.http.activity import ActivityMiddleware

    a = Activity()
    a.last_at = 0.0

    async def app(scope, receive, send):
        pass

    import asyncio

    mw = ActivityMiddleware(app, a)
    asyncio.run(mw({"type": "http", "path": "/ollama/api/ps"}, None, None))
    assert a.last_at == 0.0
    asyncio.run(mw({"type": "http", "path": "/ollama/api/chat"}, None, None))
    assert a.last_at > 0.0
