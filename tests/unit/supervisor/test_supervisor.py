"""The supervisor's task over fake workers: lazy loads shared by concurrent callers, idle unloads on
time with nobody watching, room made least recently used first, reloads, and an idle unload meeting
a reload of the same model. No process starts; the decisions and the units are the real ones. Time
is a fake clock's: idle unloads and the idle ticker are asserted in virtual seconds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.clock import FakeClock
from tests.support.fake_worker import FakeWorker, run_with_fakes, until, use_fake_workers
from tests.support.servers import free_port
from vllmmlxd.config.load import load_config
from vllmmlxd.supervisor import states
from vllmmlxd.supervisor.loads import IDLE_CHECK_S, Loads
from vllmmlxd.supervisor.memory import Capacity
from vllmmlxd.supervisor.slot.backoff import BackoffPolicy
from vllmmlxd.supervisor.slot.responder import RETRY_SLACK_S
from vllmmlxd.supervisor.slot.slot import SlotSettings
from vllmmlxd.supervisor.slot.tuning import Tuning
from vllmmlxd.supervisor.supervisor import Supervisor


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch) -> FakeClock:
    return use_fake_workers(monkeypatch)


@pytest.fixture
def clock(fake_workers: FakeClock) -> FakeClock:
    """The test's virtual time: the supervisor's, its slots' and its fake workers'."""
    return fake_workers


def entry(**fields) -> dict:
    return {"model": "builtin:tiny", "port": free_port(), **fields}


def write(path: Path, models: dict) -> None:
    path.write_text(yaml.safe_dump({"daemon": {"state_dir": str(path.parent)}, "models": models}, sort_keys=False))


async def push(health_socket, config):
    return True, "hash"


def make(tmp_path: Path, models: dict, push_settings=push) -> Supervisor:
    path = tmp_path / "config.yaml"
    write(path, models)
    tuning = Tuning(health_failures=2, ready_timeout_s=5.0, policy=BackoffPolicy(max_fast_crashes=3))
    settings = SlotSettings(state_dir=tmp_path, drain_timeout=1, log_level="info", tuning=tuning)
    return Supervisor(load_config(path), settings, push_settings=push_settings, clock=FakeWorker.clock)


def with_memory(sup: Supervisor, usable_mb: int, each_mb: int) -> None:
    """Every model weighs ``each_mb``; ``usable_mb`` is what the machine has for them."""

    def footprints():
        return Capacity(usable_mb, 0), {name: each_mb for name in sup.entry_units()}

    sup.loads = Loads(sup.entry_units, sup.ops, footprints, sup.clock)


def run(coro):
    return run_with_fakes(coro, 20)


def state(sup: Supervisor, name: str) -> str:
    return sup.shown(name)[0]


def worker_of(sup: Supervisor, name: str) -> FakeWorker:
    worker = sup.units[name].slot.serving  # type: ignore[attr-defined]
    assert worker is not None
    return worker


def test_eager_models_start_and_lazy_ones_wait_unloaded(tmp_path):
    async def main():
        sup = make(tmp_path, {"e": entry(), "l": entry(load="lazy")})
        await sup.start_all()
        assert state(sup, "e") == states.READY and state(sup, "l") == states.UNLOADED
        assert [v.name for v in sup.status().models] == ["e", "l"] and sup.ready_count() == (1, 2)
        await sup.stop_all()

    run(main())


def test_concurrent_loads_share_one_worker(tmp_path):
    async def main():
        sup = make(tmp_path, {"l": entry(load="lazy")})
        await sup.start_all()
        replies = await asyncio.gather(*(sup.load("l") for _ in range(5)))
        assert all(r.ok for r in replies) and len(FakeWorker.spawned) == 1
        assert state(sup, "l") in (states.READY, states.IDLE)
        await sup.stop_all()

    run(main())


def test_an_idle_model_is_unloaded_on_time_with_nobody_watching(tmp_path, clock):
    async def main():
        sup = make(tmp_path, {"l": entry(load="lazy", idle_unload_s=30)})
        await sup.start_all()
        assert (await sup.load("l")).ok
        worker = worker_of(sup, "l")
        worker.idle_since = clock.monotonic()  # its last request ended now; nobody asks for status
        took = await clock.run_until(lambda: state(sup, "l") == states.UNLOADED)
        assert 30 <= took < 30 + IDLE_CHECK_S and not worker.alive  # not before its limit, at the next tick
        # Loaded again on the next request.
        assert (await sup.load("l")).ok and len(FakeWorker.spawned) == 2
        await sup.stop_all()

    run(main())


def test_a_requests_keep_alive_replaces_idle_unload_s_and_leaves_an_eager_model_alone(tmp_path, clock):
    async def main():
        sup = make(tmp_path, {"l": entry(load="lazy"), "e": entry()})  # the lazy one: no idle_unload_s at all
        await sup.start_all()
        assert (await sup.load("l")).ok
        for name in ("l", "e"):
            worker_of(sup, name).idle_since = clock.monotonic()
            worker_of(sup, name).keep_alive_s = 0.0  # keep_alive: 0, "unload once done"
        await clock.advance(IDLE_CHECK_S)  # the next tick
        assert state(sup, "l") == states.UNLOADED
        assert state(sup, "e") == states.READY and worker_of(sup, "e").alive
        await sup.stop_all()

    run(main())


def test_a_model_loaded_for_a_turned_away_client_waits_for_its_retry_before_unloading(tmp_path, clock):
    """Found in a loaded run: a 503 said "retry after 5 s", the model loaded, sat idle past its
    idle_unload_s and was unloaded just before the client came back, which was turned away again."""

    async def main():
        sup = make(tmp_path, {"l": entry(load="lazy", idle_unload_s=1)})
        await sup.start_all()
        port = sup.units["l"].config.port
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.1:{port}/v1/models")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"  # and the request loads it
        await until(lambda: state(sup, "l") == states.READY)
        worker = worker_of(sup, "l")
        worker.idle_since = clock.monotonic()
        await clock.advance(5)  # five times idle_unload_s: shown idle, but kept for the client it turned away
        assert state(sup, "l") == states.IDLE and worker.alive
        await clock.advance(RETRY_SLACK_S)  # the client's retry window (5 s + its slack) is over: unloaded
        assert state(sup, "l") == states.UNLOADED and not worker.alive
        await sup.stop_all()

    run(main())


def test_a_busy_model_is_never_unloaded_for_being_idle(tmp_path, clock):
    async def main():
        sup = make(tmp_path, {"l": entry(load="lazy", idle_unload_s=1)})
        await sup.start_all()
        assert (await sup.load("l")).ok
        worker_of(sup, "l").idle_since = None  # a request runs
        await clock.advance(6 * IDLE_CHECK_S)  # six ticks, six times its idle_unload_s
        assert state(sup, "l") == states.READY
        await sup.stop_all()

    run(main())


def test_the_least_recently_used_idle_model_makes_room(tmp_path, clock):
    async def main():
        sup = make(tmp_path, {n: entry(load="lazy") for n in ("l1", "l2", "l3")})
        with_memory(sup, usable_mb=250, each_mb=100)
        await sup.start_all()
        assert (await sup.load("l1")).ok and (await sup.load("l2")).ok
        now = clock.monotonic()
        worker_of(sup, "l1").idle_since = now - 1  # used a second ago
        worker_of(sup, "l2").idle_since = now - 60  # the least recently used
        assert (await sup.load("l3")).ok
        assert state(sup, "l2") == states.UNLOADED
        assert state(sup, "l1") != states.UNLOADED and state(sup, "l3") != states.UNLOADED
        await sup.stop_all()

    run(main())


def test_no_room_when_every_loaded_model_is_busy_and_the_numbers_say_so(tmp_path):
    async def main():
        sup = make(tmp_path, {"e": entry(), "l": entry(load="lazy")})
        with_memory(sup, usable_mb=150, each_mb=100)
        await sup.start_all()
        reply = await sup.load("l")
        assert not reply.ok and "not enough memory to load l" in reply.message and "e 100 MB" in reply.message
        assert state(sup, "l") == states.UNLOADED and len(FakeWorker.spawned) == 1
        await sup.stop_all()

    run(main())


def test_stop_keeps_a_lazy_model_stopped_and_start_loads_it(tmp_path):
    async def main():
        sup = make(tmp_path, {"l": entry(load="lazy")})
        await sup.start_all()
        assert (await sup.load("l")).ok
        assert (await sup.stop("l")).ok and state(sup, "l") == states.STOPPED
        reply = await sup.load("l")
        assert not reply.ok and "stopped" in reply.message
        assert (await sup.start("l")).ok and state(sup, "l") in (states.READY, states.IDLE)
        await sup.stop_all()

    run(main())


def test_a_reload_adds_removes_and_swaps(tmp_path):
    async def main():
        models = {"keep": entry(), "gone": entry(), "swap": entry()}
        sup = make(tmp_path, models)
        await sup.start_all()
        old = worker_of(sup, "swap")
        models = {"keep": models["keep"], "swap": {**models["swap"], "max_num_seqs": 4}, "new": entry()}
        write(tmp_path / "config.yaml", models)
        reply = await sup.reload()
        assert reply.ok, reply.error
        assert list(sup.entry_units()) == ["keep", "swap", "new"]
        assert state(sup, "new") == states.READY and worker_of(sup, "swap") is not old and not old.alive
        assert sup.units["swap"].config.max_num_seqs == 4
        assert sup.last_reload is not None and sup.last_reload.ok
        await sup.stop_all()

    run(main())


def test_reloads_asked_together_run_one_after_the_other(tmp_path):
    async def main():
        sup = make(tmp_path, {"a": entry()})
        await sup.start_all()
        replies = await asyncio.gather(sup.reload(), sup.reload(dry_run=True), sup.reload())
        assert all(r.ok for r in replies) and replies[1].dry_run
        await sup.stop_all()

    run(main())


@pytest.mark.parametrize("first", ["unload", "reload"])
def test_an_idle_unload_and_a_reload_of_the_same_model_at_once_end_in_one_state(tmp_path, first, clock):
    """Both decisions come to the one task; whichever is first, the other waits for it, and the model
    ends with the new entry: unloaded (taken on its next load) or ready on a new worker."""

    async def main():
        models = {"l": entry(load="lazy", idle_unload_s=0.2)}
        sup = make(tmp_path, models)
        await sup.start_all()
        assert (await sup.load("l")).ok
        worker = worker_of(sup, "l")
        write(tmp_path / "config.yaml", {"l": {**models["l"], "max_num_seqs": 4}})  # a new-worker key
        if first == "unload":
            FakeWorker.drain_s = 2.0  # so the unload and the swap overlap
            worker.idle_since = clock.monotonic() - 10  # due at the next tick
            await clock.advance(IDLE_CHECK_S)
            assert sup.ops.on("l") == "unloading"  # draining, for 2 s
            reload = asyncio.create_task(sup.reload())
            await until(lambda: sup.ops.on("l") == "reloading")  # the config is read in a thread
            assert worker.alive  # the reload waits for the unload
            await clock.advance(FakeWorker.drain_s)
        else:
            FakeWorker.load_s = 2.0  # so the swap and the next ticks overlap
            reload = asyncio.create_task(sup.reload())
            await until(lambda: "l" in sup.ops.busy)
            worker.idle_since = clock.monotonic() - 10  # due while the reload swaps it
            await clock.advance(IDLE_CHECK_S)  # a tick: the model is the reload's, left alone
            assert sup.ops.on("l") == "reloading" and worker.alive
            await clock.advance(FakeWorker.load_s)
        reply = await reload
        FakeWorker.load_s = FakeWorker.drain_s = 0.0
        assert reply.ok, reply.error
        unit = sup.units["l"]
        assert unit.config.max_num_seqs == 4
        await until(lambda: "l" not in sup.ops.busy)
        final = state(sup, "l")
        assert final in (states.UNLOADED, states.READY, states.IDLE)
        serving = unit.slot.serving
        assert (serving is None) == (final == states.UNLOADED)
        assert serving is None or serving.config.max_num_seqs == 4
        assert (await sup.load("l")).ok  # and it serves the next request
        await sup.stop_all()

    run(main())
