"""A slot's news as pure functions: the answers its waiting callers get, and its log lines."""

from __future__ import annotations

import asyncio
import logging

from vllmmlxd.supervisor import states
from vllmmlxd.supervisor.slot.slot_news import announcement, settle, why_not


def futures(n: int) -> list[asyncio.Future]:
    loop = asyncio.new_event_loop()
    try:
        return [loop.create_future() for _ in range(n)]
    finally:
        loop.close()


def test_a_stop_answers_both_kinds_of_waiter_and_a_start_is_told_why():
    serving, stopped = futures(2)
    answered, keep = settle([(serving, "serving"), (stopped, "stopped")], "stopped", "unused")
    assert answered == [(serving, (False, "stopped before it was ready")), (stopped, (True, None))]
    assert keep == []


def test_a_failure_answers_callers_waiting_to_be_served_with_its_reason_and_keeps_the_others():
    serving, stopped = futures(2)
    why = why_not("failed", "crashed 3 times", "exited with code 1")
    answered, keep = settle([(serving, "serving"), (stopped, "stopped")], "failed", why)
    assert answered == [(serving, (False, "crashed 3 times: exited with code 1"))]
    assert keep == [(stopped, "stopped")]


def test_gone_answers_only_callers_waiting_for_a_stop():
    serving, stopped = futures(2)
    answered, keep = settle([(serving, "serving"), (stopped, "stopped")], "gone", "")
    assert answered == [(stopped, (True, None))] and keep == [(serving, "serving")]


def test_the_log_line_of_each_state_carries_what_explains_it():
    common = dict(pid=7, worker_pid=8, held_pid=6, url="http://h:1", exit_code=3, reason="r", retry_in_s=0.5)
    assert announcement("m", states.READY, False, **common) == (
        "worker.ready",
        logging.INFO,
        {"model": "m", "pid": 7, "url": "http://h:1"},
    )
    assert announcement("m", states.READY, True, **common) == (
        "worker.replacing",
        logging.INFO,
        {"model": "m", "old_pid": 6, "pid": 8},
    )
    assert announcement("m", states.BACKOFF, False, **common)[1:] == (
        logging.WARNING,
        {"model": "m", "exit_code": 3, "retry_in_s": 0.5},
    )
    assert announcement("m", states.FAILED, False, **common)[1:] == (
        logging.ERROR,
        {"model": "m", "exit_code": 3, "reason": "r"},
    )
