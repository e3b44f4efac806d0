"""Usage per key (vllmmlxd/usage.py): the budget decisions as pure functions, and the ledger that
every worker writes to one file, read back across workers and restarts."""

from __future__ import annotations

import time
from datetime import datetime

from vllmmlxd.usage import Budget, Counts, Ledger, Spent, left, next_day, next_month, overrun, period_starts, totals

NOON = datetime(2026, 12, 4, 12, 0).timestamp()  # local time


def spent(day_tokens: int = 0, month_tokens: int = 0, day_requests: int = 0) -> Spent:
    return Spent(Counts(requests=day_requests, input_tokens=day_tokens), Counts(input_tokens=month_tokens))


def test_a_budget_stops_at_its_limit_and_says_when_it_resets():
    budget = Budget(tokens_per_day=100, tokens_per_month=1000, requests_per_day=5)
    assert overrun(budget, spent(99, 500, 4), NOON) is None
    over = overrun(budget, spent(100, 500, 4), NOON)
    assert over is not None and over.limit == "tokens_per_day" and over.used == 100
    assert over.resets == datetime(2026, 12, 5).astimezone()
    assert over.retry_after(NOON) == 12 * 3600 + 1
    assert "budget of 100 tokens per day (100 used)" in over.message("alice")
    month = overrun(budget, spent(10, 1000, 1), NOON)
    assert month is not None and month.limit == "tokens_per_month" and month.resets == datetime(2027, 1, 1).astimezone()
    requests = overrun(budget, spent(10, 10, 5), NOON)
    assert requests is not None and "5 requests per day" in requests.message("alice")
    assert overrun(Budget(), spent(10**9, 10**9, 10**6), NOON) is None  # no limits: never
    assert left(budget, spent(30, 900, 5)) == {"tokens_per_day": 70, "tokens_per_month": 100, "requests_per_day": 0}


def test_periods_are_the_local_calendar():
    day, month = period_starts(NOON)
    assert (day.day, day.hour, month.day) == (4, 0, 1)
    assert next_day(day) == datetime(2026, 12, 5).astimezone()
    assert next_month(datetime(2027, 2, 1).astimezone()) == datetime(2027, 3, 1).astimezone()


def test_two_workers_count_into_one_file_and_a_restart_keeps_it(tmp_path):
    path = tmp_path / "usage.sqlite3"
    a, b = Ledger(path), Ledger(path)
    try:
        a.record("alice", "qwen", Counts(requests=1, input_tokens=10, cached_tokens=4, output_tokens=5))
        b.record("alice", "llama", Counts(requests=1, errors=1))
        b.record("bob", "llama", Counts(requests=1, input_tokens=3, output_tokens=2))
        first = a.spent("alice")  # read from the file: what b recorded is not written yet
        assert (first.day.requests, first.day.tokens) == (1, 15)
        b.sync()
        a.sync()
        now = a.spent("alice")
        assert (now.day.requests, now.day.errors, now.day.tokens, now.month.tokens) == (2, 1, 15, 15)
        a.record("alice", "qwen", Counts(requests=1, output_tokens=7))  # seen at once by the worker that ran it
        assert a.spent("alice").day.tokens == 22
        a.sync()
        assert a.spent("alice").day.tokens == 22  # once written, counted once
        assert a.snapshot()[("alice", "qwen")].output_tokens == 12
    finally:
        a.close()
        b.close()
    again = Ledger(path)
    try:
        rows = totals(again._db, since=time.time() - 3600)
        assert rows[("alice", "qwen")] == Counts(requests=2, input_tokens=10, cached_tokens=4, output_tokens=12)
        assert rows[("bob", "llama")].tokens == 5 and again.spent("alice").day.requests == 3
    finally:
        again.close()


def test_the_thread_writes_within_a_second_or_two(tmp_path):
    path = tmp_path / "usage.sqlite3"
    worker, daemon = Ledger(path), Ledger(path)
    try:
        worker.record("alice", "qwen", Counts(requests=1, output_tokens=3))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not totals(daemon._db, since=0):
            time.sleep(0.1)
        assert totals(daemon._db, since=0)[("alice", "qwen")].output_tokens == 3
    finally:
        worker.close()
        daemon.close()


def test_a_key_s_budget_is_read_from_the_config_and_reaches_each_entry_s_grant():
    import pytest
    from pydantic import ValidationError

    from vllmmlxd.config.schema import Config

    config = Config.model_validate(
        {
            "api_keys": {"alice": {"key": "k1", "budget": {"tokens_per_day": 500, "requests_per_day": 20}}},
            "models": {"qwen": {"model": "builtin:tiny", "port": 8001, "api_keys": ["alice"]}},
        }
    )
    [grant] = config.models["qwen"].key_grants
    assert grant.budget.plain() == Budget(tokens_per_day=500, requests_per_day=20)
    with pytest.raises(ValidationError):
        Config.model_validate({"api_keys": {"a": {"key": "k", "budget": {"tokens_per_day": -1}}}, "models": {}})
    with pytest.raises(ValidationError):
        Config.model_validate({"api_keys": {"a": {"key": "k", "budget": {"tokens": 5}}}, "models": {}})
