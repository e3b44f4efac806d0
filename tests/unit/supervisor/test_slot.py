"""A slot's actor driving fake workers: commands never wait behind a loading or crash-looping
worker, crashes back off then fail, a failed swap keeps the old worker, the stand-in answers
503 on the port while no worker serves it. Time is a fake clock's: backoff delays, health checks
and fast crashes are asserted in virtual seconds, and only the stand-in's sockets take real time."""

from __future__ import annotations

import asyncio
import itertools
import socket
from pathlib import Path

import pytest

from tests.support.clock import FakeClock
from tests.support.fake_worker import FakeWorker, run_with_fakes, until, use_fake_workers
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.supervisor import states
from vllmmlxd.supervisor.slot.backoff import BackoffPolicy
from vllmmlxd.supervisor.slot.responder import RETRY_SLACK_S
from vllmmlxd.supervisor.slot.slot import Slot, SlotSettings
from vllmmlxd.supervisor.slot.tuning import Tuning

# The production timings (a first restart after 0.5 s, doubling; a crash within 10 s of READY is
# fast), giving up sooner; health checks every 10 s (the default), two missed ones kill a worker.
POLICY = BackoffPolicy(max_fast_crashes=3)


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch) -> FakeClock:
    return use_fake_workers(monkeypatch)


@pytest.fixture
def clock(fake_workers: FakeClock) -> FakeClock:
    """The test's virtual time: the slot's and its fake workers'."""
    return fake_workers


def settings(**tuning) -> SlotSettings:
    t = Tuning(**{"health_failures": 2, "ready_timeout_s": 5.0, "policy": POLICY, **tuning})
    return SlotSettings(state_dir=Path("/tmp"), drain_timeout=1, log_level="info", tuning=t)


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.set_inheritable(True)
    return sock


def new_slot(**tuning) -> Slot:
    sock = listening_socket()
    config = ModelConfig(model="builtin:tiny", port=sock.getsockname()[1])
    return Slot("a", config, settings(**tuning), lambda: None, sock=sock, clock=FakeWorker.clock)


def run(coro):
    return run_with_fakes(coro, 10)


async def get(port: int, path: str = "/v1/models") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data


def test_start_then_stop():
    async def main():
        slot = new_slot()
        assert await slot.start() and slot.state == states.READY and slot.pid == FakeWorker.spawned[0].pid
        assert await slot.stop() and slot.state == states.STOPPED and not FakeWorker.spawned[0].alive
        await slot.shutdown()

    run(main())


def test_a_stop_interrupts_a_start_at_once_and_kills_the_half_started_worker(clock):
    async def main():
        FakeWorker.script = ["hang"]
        slot = new_slot(ready_timeout_s=900)
        start = asyncio.create_task(slot.start())
        await clock.settle()
        assert slot.state == states.STARTING and slot.worker is not None
        began = clock.monotonic()
        assert await slot.stop()
        assert clock.monotonic() - began == 0  # at once: it waited on no timer (only the test moves the clock)
        assert await start is False
        assert FakeWorker.spawned[0].exit_code == -9 and slot.state == states.STOPPED
        await slot.shutdown()

    run(main())


def test_crashes_back_off_then_fail_and_a_stop_during_backoff_is_immediate(clock):
    async def main():
        FakeWorker.script = [1, 1, 1]
        slot = new_slot()
        assert await slot.start() is False  # its first crash answers the start
        assert slot.state == states.BACKOFF
        await clock.advance(0.49)
        assert len(FakeWorker.spawned) == 1  # no restart before 0.5 s...
        await clock.advance(0.01)
        assert len(FakeWorker.spawned) == 2 and slot.state == states.BACKOFF  # ...one at 0.5 s, and it crashed
        await clock.advance(0.99)
        assert len(FakeWorker.spawned) == 2  # then 1 s
        await clock.advance(0.01)
        assert slot.state == states.FAILED  # the third fast crash in a row: no more restarts
        assert len(FakeWorker.spawned) == 3 and slot.restarts == 2 and slot.last_exit_code == 1
        assert "crashed 3 times" in slot.fail_reason
        FakeWorker.script = [1]
        assert await slot.start() is False and slot.state == states.BACKOFF
        assert await slot.stop() and slot.state == states.STOPPED
        await clock.advance(POLICY.max_s)  # the cancelled timer starts nothing, however long
        assert len(FakeWorker.spawned) == 4 and clock.pending() == []
        await slot.shutdown()

    run(main())


def test_restarts_wait_out_doubling_delays_up_to_their_cap(clock):
    async def main():
        FakeWorker.script = [1] * 6  # six crashes, then a worker that loads
        slot = new_slot(policy=BackoffPolicy(initial_s=0.5, max_s=5, max_fast_crashes=7))
        assert await slot.start() is False
        await clock.advance(0.5 + 1 + 2 + 4 + 5 + 5)
        assert slot.state == states.READY and slot.restarts == 6
        times = [w.spawned_at for w in FakeWorker.spawned]
        assert [b - a for a, b in itertools.pairwise(times)] == pytest.approx([0.5, 1, 2, 4, 5, 5])
        await slot.shutdown()

    run(main())


@pytest.mark.parametrize(("ready_for", "fast"), [(9.9, True), (10.0, False)])
def test_a_crash_is_fast_by_its_time_since_ready_not_since_its_start(clock, ready_for, fast):
    """Each worker loads for a minute, far past ``fast_crash_s`` (10 s) from its start; dying within
    10 s of READY is still a crash loop (given up after three), dying later starts the count again."""

    async def main():
        FakeWorker.load_s = 60.0
        slot = new_slot(ready_timeout_s=900)
        start = asyncio.create_task(slot.start())
        await clock.advance(FakeWorker.load_s)
        assert await start
        for crash in range(1, POLICY.max_fast_crashes + 1):
            await clock.advance(ready_for)
            FakeWorker.spawned[-1].exit(1)
            await clock.settle()
            assert slot.counters.fast_crashes == (crash if fast else 1)
            if slot.state == states.FAILED:
                break
            assert slot.state == states.BACKOFF
            await clock.advance(POLICY.delay(slot.counters.fast_crashes) + FakeWorker.load_s)
            assert slot.state == states.READY
        assert (slot.state == states.FAILED) == fast
        assert slot.restarts == (2 if fast else 3)
        await slot.shutdown()

    run(main())


def test_a_worker_not_ready_within_its_ready_timeout_is_killed_and_restarted(clock):
    async def main():
        FakeWorker.script = ["hang"]
        slot = new_slot()  # ready_timeout_s: 5
        start = asyncio.create_task(slot.start())
        await clock.advance(4.9)
        assert slot.state == states.STARTING and FakeWorker.spawned[0].alive
        await clock.advance(0.1)
        assert await start is False and FakeWorker.spawned[0].exit_code == -9
        assert slot.state == states.BACKOFF and slot.last_error.startswith("did not become ready within 5s")
        await clock.advance(POLICY.initial_s)  # a fast crash: restarted after the first delay
        assert slot.state == states.READY and len(FakeWorker.spawned) == 2
        await slot.shutdown()

    run(main())


def test_a_load_failure_fails_at_once():
    async def main():
        FakeWorker.script = [states.EXIT_LOAD_FAILED]
        slot = new_slot()
        assert await slot.start() is False
        assert slot.state == states.FAILED and len(FakeWorker.spawned) == 1 and slot.restarts == 0
        await slot.shutdown()

    run(main())


def test_a_spawn_error_is_a_crash_with_its_reason(clock):
    async def main():
        FakeWorker.spawn_error = "cannot start a worker: no such file"
        slot = new_slot()
        assert await slot.start() is False
        assert slot.state == states.BACKOFF and "no such file" in slot.last_error
        FakeWorker.spawn_error = None
        await clock.advance(POLICY.initial_s)  # its backoff: then a worker starts
        assert slot.state == states.READY
        await slot.shutdown()

    run(main())


def test_a_failed_swap_keeps_the_old_worker_and_a_good_one_replaces_it(clock):
    async def main():
        slot = new_slot()
        await slot.start()
        old = FakeWorker.spawned[0]
        FakeWorker.script = [1]
        changed = slot.config.model_copy(update={"prefill_step_size": 128})
        ok, error = await slot.replace(changed)
        assert not ok and "said goodbye" in error
        assert slot.worker is old and old.alive and slot.state == states.READY and slot.config.prefill_step_size == 512
        ok, _ = await slot.replace(changed)
        assert ok and slot.worker is FakeWorker.spawned[2] and slot.config.prefill_step_size == 128
        await clock.settle()
        assert not old.alive  # drained
        await slot.shutdown()

    run(main())


def test_a_command_during_a_swap_is_refused_not_queued_forever(clock):
    async def main():
        slot = new_slot(ready_timeout_s=900)
        await slot.start()
        FakeWorker.script = ["hang"]
        swap = asyncio.create_task(slot.restart())
        await clock.settle()
        assert len(FakeWorker.spawned) == 2
        ok, error = await slot.replace(slot.config)
        assert not ok and "busy" in error
        assert await slot.stop()  # a stop is never refused: it kills the new one, drains the old
        assert await swap is False and not FakeWorker.spawned[1].alive
        await clock.settle()
        assert not any(w.alive for w in FakeWorker.spawned)  # the old one's drain ends too
        await slot.shutdown()

    run(main())


def test_a_worker_that_stops_answering_is_killed_and_restarted(clock):
    async def main():
        slot = new_slot()  # checked every 10 s: two missed checks in a row kill it
        await slot.start()
        first = FakeWorker.spawned[0]
        first.answers = False
        await clock.advance(10)
        assert first.alive and slot.state == states.READY  # one missed check
        await clock.advance(10)
        assert not first.alive and slot.state == states.BACKOFF  # the second: killed, a crash
        await clock.advance(POLICY.initial_s)  # ready for 20 s: not a fast crash, the first delay
        assert slot.state == states.READY and slot.worker is not first
        assert first.exit_code == -9 and slot.restarts == 1
        await slot.shutdown()

    run(main())


def test_health_checks_leave_no_task_behind(clock):
    """A ready worker's exit is awaited once, not anew at each check (a shielded wait per check stayed
    pending until the worker exited: 8,640 tasks a day per worker at the default 10 s)."""

    async def main():
        slot = new_slot()
        await slot.start()
        await clock.advance(10)
        before = len(asyncio.all_tasks())
        await clock.advance(100)  # ten more checks
        assert len(asyncio.all_tasks()) == before
        await slot.shutdown()

    run(main())


def test_the_stand_in_answers_503_while_no_worker_serves():
    async def main():
        FakeWorker.script = [states.EXIT_LOAD_FAILED]
        slot = new_slot()
        port = slot.config.port
        await slot.start()
        body = await get(port)
        assert body.startswith(b"HTTP/1.1 503") and b"retry-after: 30" in body and b"model a failed: " in body
        assert b'"status": "failed"' in await get(port, "/health")
        assert await slot.start()  # ready: the worker's socket alone
        assert not slot._stand_in.running
        assert await slot.stop()
        assert b"model a is stopped" in await get(port)
        await slot.shutdown()
        with pytest.raises(OSError):
            await get(port)  # closed with the slot

    run(main())


def test_a_client_turned_away_is_expected_back_by_its_retry_after(clock):
    async def main():
        sock = listening_socket()
        config = ModelConfig(model="builtin:tiny", port=sock.getsockname()[1], load="lazy")
        demanded: list[bool] = []
        slot = Slot(
            "a",
            config,
            settings(),
            lambda: None,
            sock=sock,
            lazy=True,
            on_demand=lambda: demanded.append(True),
            clock=clock,
        )
        body = await get(config.port)
        assert body.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in body
        await until(lambda: bool(demanded))  # the stand-in tells the slot after it answered
        await clock.settle()
        assert slot.expected_until == clock.monotonic() + 5 + RETRY_SLACK_S
        await slot.shutdown()

    run(main())


def test_after_shutdown_commands_are_refused():
    async def main():
        slot = new_slot()
        await slot.start()
        await slot.shutdown()
        assert await slot.start() is False

    run(main())


def test_live_settings_are_pushed_to_the_running_worker_and_a_failed_swap_keeps_them():
    async def main():
        pushed = []

        async def push(health_socket, config):
            pushed.append(config.default_temperature)
            return (config.default_temperature != 0.9, None if config.default_temperature != 0.9 else "refused")

        sock = listening_socket()
        slot = Slot(
            "a",
            ModelConfig(model="builtin:tiny", port=sock.getsockname()[1]),
            settings(),
            lambda: None,
            sock=sock,
            push_settings=push,
        )
        await slot.start()
        worker = slot.worker
        live = slot.config.model_copy(update={"default_temperature": 0.2})
        assert await slot.apply_settings(live) == (True, None)
        assert slot.worker is worker and worker.config.default_temperature == 0.2 and pushed == [0.2]
        assert await slot.apply_settings(slot.config.model_copy(update={"default_temperature": 0.9})) == (
            False,
            "refused",
        )
        FakeWorker.script = [1]
        ok, _ = await slot.replace(live.model_copy(update={"prefill_step_size": 128}))
        assert not ok and slot.config.default_temperature == 0.2 and slot.config.prefill_step_size == 512
        await slot.shutdown()

    run(main())
