"""A slot's actor driving fake workers: commands never wait behind a loading or crash-looping
worker, crashes back off then fail, a failed swap keeps the old worker, the stand-in answers
503 on the port while no worker serves it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.support.fake_worker import FakeWorker
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.supervisor import slot_workers as slot_workers_module
from vllmmlxd.supervisor import states
from vllmmlxd.supervisor.backoff import BackoffPolicy
from vllmmlxd.supervisor.slot import Slot, SlotSettings
from vllmmlxd.supervisor.tuning import Tuning


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch):
    FakeWorker.script, FakeWorker.spawned, FakeWorker.spawn_error = [], [], None
    monkeypatch.setattr(slot_workers_module, "WorkerProcess", FakeWorker)


def settings(**tuning) -> SlotSettings:
    policy = BackoffPolicy(initial_s=0.01, max_s=0.05, fast_crash_s=10, max_fast_crashes=3)
    t = Tuning(**{"health_interval_s": 0.02, "health_failures": 2, "ready_timeout_s": 5.0, "policy": policy, **tuning})
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
    return Slot("a", config, settings(**tuning), lambda: None, sock=sock)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


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


def test_a_stop_interrupts_a_start_at_once_and_kills_the_half_started_worker():
    async def main():
        FakeWorker.script = ["hang"]
        slot = new_slot(ready_timeout_s=900)
        start = asyncio.create_task(slot.start())
        await until(lambda: slot.state == states.STARTING and slot.worker is not None)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await slot.stop()
        assert loop.time() - began < 0.5
        assert await start is False
        assert FakeWorker.spawned[0].exit_code == -9 and slot.state == states.STOPPED
        await slot.shutdown()

    run(main())


def test_crashes_back_off_then_fail_and_a_stop_during_backoff_is_immediate():
    async def main():
        FakeWorker.script = [1, 1, 1]
        slot = new_slot()
        assert await slot.start() is False  # its first crash answers the start
        await until(lambda: slot.state == states.FAILED)
        assert len(FakeWorker.spawned) == 3 and slot.restarts == 2 and slot.last_exit_code == 1
        assert "crashed 3 times" in slot.fail_reason
        FakeWorker.script = [1]
        assert await slot.start() is False and slot.state == states.BACKOFF
        assert await slot.stop() and slot.state == states.STOPPED
        await asyncio.sleep(0.1)  # the cancelled timer starts nothing
        assert len(FakeWorker.spawned) == 4
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


def test_a_spawn_error_is_a_crash_with_its_reason():
    async def main():
        FakeWorker.spawn_error = "cannot start a worker: no such file"
        slot = new_slot()
        assert await slot.start() is False
        assert slot.state == states.BACKOFF and "no such file" in slot.last_error
        FakeWorker.spawn_error = None
        await until(lambda: slot.state == states.READY)
        await slot.shutdown()

    run(main())


def test_a_failed_swap_keeps_the_old_worker_and_a_good_one_replaces_it():
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
        await until(lambda: not old.alive)  # drained
        await slot.shutdown()

    run(main())


def test_a_command_during_a_swap_is_refused_not_queued_forever():
    async def main():
        slot = new_slot(ready_timeout_s=900)
        await slot.start()
        FakeWorker.script = ["hang"]
        swap = asyncio.create_task(slot.restart())
        await until(lambda: len(FakeWorker.spawned) == 2)
        ok, error = await slot.replace(slot.config)
        assert not ok and "busy" in error
        assert await slot.stop()  # a stop is never refused: it kills the new one, drains the old
        assert await swap is False and not FakeWorker.spawned[1].alive
        await until(lambda: not any(w.alive for w in FakeWorker.spawned))  # the old one's drain ends too
        await slot.shutdown()

    run(main())


def test_a_worker_that_stops_answering_is_killed_and_restarted():
    async def main():
        slot = new_slot()
        await slot.start()
        first = FakeWorker.spawned[0]
        first.answers = False
        await until(lambda: slot.state == states.READY and slot.worker is not first)
        assert first.exit_code == -9 and slot.restarts == 1
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
