"""RankGroup: a distributed entry's ranks as one worker, over tiny fake ranks (no model is loaded).

Every rank is a small Python program that reads its config line from stdin, writes what it got
(its MLX variables, the hostfile, its pid) to ``rank<r>.json``, then does what ``FAKE_RANKS``
says for its rank: sleep, exit with a code (at once or after a while), or wait for its stdin's
EOF. Rank 0 runs it as its module (``python -m fake_rank`` on PYTHONPATH), the others through a
patched ``rank_launch.follower_argv``; a remote rank goes through ``tests/fixtures/fake-ssh``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.clock import FakeClock
from vllmmlxd.config.entries import ResolvedModel
from vllmmlxd.supervisor.clock import REAL_CLOCK, Clock
from vllmmlxd.supervisor.slot import rank_launch, ranks
from vllmmlxd.supervisor.slot.ranks import RankGroup

pytestmark = pytest.mark.timeout(30)

FAKE_SSH = Path(__file__).resolve().parents[2] / "fixtures" / "fake-ssh"

FAKE_RANK = r"""
import json, os, stat, sys, time

line = sys.stdin.readline()
rank = os.environ.get("MLX_RANK")
out = os.environ["FAKE_RANK_DIR"]
hostfile = os.environ.get("MLX_HOSTFILE")
report = {
    "rank": rank,
    "pid": os.getpid(),
    "argv": sys.argv[1:],
    "config": json.loads(line) if line.strip() else None,
    "hostfile": open(hostfile).read() if hostfile else None,
    "hostfile_mode": stat.S_IMODE(os.stat(hostfile).st_mode) if hostfile else None,
    "hostfile_path": hostfile,
}
with open(os.path.join(out, f"rank{rank}.tmp"), "w") as f:
    json.dump(report, f)
os.replace(os.path.join(out, f"rank{rank}.tmp"), os.path.join(out, f"rank{rank}.json"))
action = json.loads(os.environ["FAKE_RANKS"]).get(rank, "sleep")
if action == "sleep":
    time.sleep(60)
elif action == "eof":  # the lifeline: wait for stdin's end, say so, exit 0
    sys.stdin.read()
    open(os.path.join(out, f"rank{rank}.eof"), "w").close()
else:  # "exit:CODE" or "exit:CODE:AFTER_S"
    _, code, *after = action.split(":")
    time.sleep(float(after[0]) if after else 0)
    sys.exit(int(code))
"""


def config(hosts: list, **dist) -> ResolvedModel:
    """A distributed entry (three ranks need smollm2's 30 layers; builtin:tiny has 2)."""
    model = "builtin:tiny" if len(hosts) == 2 else "builtin:smollm2-135m-instruct"
    return ResolvedModel.model_validate(
        {"model": model, "port": 8101, "distributed": {"hosts": hosts, "backend": "ring", "port": 40500, **dist}}
    )


@pytest.fixture
def fake_ranks(tmp_path, monkeypatch):
    """Makes every rank the fake program; returns the folder where the ranks report."""
    (tmp_path / "fake_rank.py").write_text(FAKE_RANK)
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_RANK_DIR", str(reports))
    monkeypatch.delenv("MLX_RANK", raising=False)
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    monkeypatch.setattr(
        rank_launch,
        "follower_argv",
        lambda python, name, log_level, state_dir=None: [python, "-c", FAKE_RANK, "--name", name],
    )
    return reports


def plan(monkeypatch, **actions: str) -> None:
    """What each rank does once it has reported (``r0="sleep"``, ``r1="exit:3"``...)."""
    monkeypatch.setenv("FAKE_RANKS", json.dumps({k.removeprefix("r"): v for k, v in actions.items()}))


async def spawn(cfg: ResolvedModel, state_dir: Path, clock: Clock = REAL_CLOCK) -> RankGroup:
    """The group, its followers' grace after rank 0's clean stop timed on ``clock`` (a test's fake one)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    try:
        return await RankGroup.spawn_group(
            "big",
            cfg,
            listen_fd=listener.fileno(),
            state_dir=state_dir,
            drain_timeout=1,
            log_level="info",
            sink=lambda line: None,
            module="fake_rank",
            clock=clock,
        )
    finally:
        listener.close()


async def reports(folder: Path, n: int, timeout: float = 8) -> list[dict]:
    """Each rank's report, rank 0 first, once all ``n`` have written theirs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob("rank*.json"))
        if len(found) == n:
            return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]
        await asyncio.sleep(0.02)
    raise AssertionError(f"only {len(list(folder.glob('rank*.json')))} of {n} ranks reported")


def gone(pid: int) -> bool:
    """No such process, or only its zombie (an orphan's reaper may be slow)."""
    shown = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return not shown or shown.startswith("Z")


def test_every_rank_starts_with_its_mlx_rank_and_the_shared_hostfile(fake_ranks, tmp_path, monkeypatch):
    """Three ranks: MLX_RANK 0, 1, 2; one private hostfile for all (the ring's); each got the config;
    ``pids`` lists rank 0 then the followers; ``alive`` while all run; ``kill()`` ends every rank."""
    plan(monkeypatch, r0="sleep", r1="sleep", r2="sleep")

    async def main():
        group = await spawn(config(["127.0.0.1"] * 3), tmp_path / "state")
        got = await reports(fake_ranks, 3)
        assert [r["rank"] for r in got] == ["0", "1", "2"]
        assert group.pids == [r["pid"] for r in got] and len(set(group.pids)) == 3
        assert group.alive
        assert got[0]["argv"][:2] == ["--name", "big"] and "--fd" in got[0]["argv"]  # rank 0: the worker's argv
        assert {r["hostfile_path"] for r in got} == {got[0]["hostfile_path"]}
        assert json.loads(got[1]["hostfile"]) == [["127.0.0.1:40500"], ["127.0.0.1:40501"], ["127.0.0.1:40502"]]
        assert {r["hostfile_mode"] for r in got} == {0o600}
        assert all(r["config"]["model"] == "builtin:smollm2-135m-instruct" for r in got)
        assert all(r["config"]["distributed"]["port"] == 40500 for r in got)
        group.kill()
        await asyncio.wait_for(group.wait(), 5)
        assert not group.alive
        assert [w.proc.returncode for w in group.ranks] == [-signal.SIGKILL] * 3
        assert all(gone(pid) for pid in group.pids)

    asyncio.run(main())


def test_killed_ranks_report_the_signal_not_a_stolen_status(fake_ranks, tmp_path, monkeypatch):
    """After ``kill()``, ``wait()`` signals the ranks again while they die: every one still reports
    -9 (a signal sent through ``Popen.send_signal`` would reap some first: asyncio then says 255)."""
    plan(monkeypatch, r0="sleep", r1="sleep", r2="sleep")

    async def main():
        for n in range(8):
            for old in fake_ranks.glob("rank*.json"):
                old.unlink()
            group = await spawn(config(["127.0.0.1"] * 3), tmp_path / "state")
            await reports(fake_ranks, 3)
            group.kill()
            await asyncio.wait_for(group.wait(), 5)
            assert [w.proc.returncode for w in group.ranks] == [-signal.SIGKILL] * 3, f"round {n}"

    asyncio.run(main())


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_when_a_follower_goes_first_rank_0_is_killed_and_its_code_is_the_groups(how, fake_ranks, tmp_path, monkeypatch):
    """Rank 1 exits 3 (or is SIGKILLed): ``exited()`` returns its code at once, ``wait()`` kills rank 0
    and returns rank 1's code, and ``last_lines()`` names rank 1 as the one that went first."""
    plan(monkeypatch, r0="sleep", r1="sleep" if how == "sigkill" else "exit:3:0.3")
    expected = -signal.SIGKILL if how == "sigkill" else 3

    async def main():
        clock = FakeClock()
        group = await spawn(config(["127.0.0.1", "127.0.0.1"]), tmp_path / "state", clock)
        await reports(fake_ranks, 2)
        assert group.alive
        if how == "sigkill":
            os.kill(group.followers[0].pid, signal.SIGKILL)
        assert await asyncio.wait_for(group.exited(), 5) == expected
        assert not group.alive and group.proc.returncode is None  # rank 0 still runs until wait() ends it
        assert await asyncio.wait_for(group.wait(), 5) == expected
        assert clock.elapsed < ranks.FOLLOWERS_STOP_S  # no grace after a follower's exit: the clock never moved
        assert group.exit_code == expected and group.proc.returncode == -signal.SIGKILL
        shown = group.last_lines()
        assert f"rank 1 (127.0.0.1) exited with code {expected}" in shown
        assert "event=rank.exited" in shown

    asyncio.run(main())


def test_after_rank_0s_clean_stop_followers_may_end_on_their_own(fake_ranks, tmp_path, monkeypatch):
    """Rank 0 exits 0 (it drained and told the others to stop): a follower that exits 0 just after
    is not killed (its code stays 0), and the group's code is rank 0's. The grace is on a fake clock
    nobody moves: however slow the machine, the follower has the time it needs."""
    plan(monkeypatch, r0="exit:0:0.2", r1="exit:0:0.6")

    async def main():
        group = await spawn(config(["127.0.0.1", "127.0.0.1"]), tmp_path / "state", FakeClock())
        await reports(fake_ranks, 2)
        assert await asyncio.wait_for(group.wait(), 5) == 0
        assert group.followers[0].proc.returncode == 0  # not -9: it had the time to follow
        assert "rank 0 (127.0.0.1) exited with code 0" in group.last_lines()

    asyncio.run(main())


def test_a_follower_that_does_not_follow_rank_0s_stop_is_killed_after_the_grace(fake_ranks, tmp_path, monkeypatch):
    """Rank 0 exits 0 but rank 1 goes on: after FOLLOWERS_STOP_S (on the clock) it is killed."""
    plan(monkeypatch, r0="exit:0:0.1", r1="sleep")

    async def main():
        clock = FakeClock()
        group = await spawn(config(["127.0.0.1", "127.0.0.1"]), tmp_path / "state", clock)
        await reports(fake_ranks, 2)
        await group.exited()
        waiting = asyncio.create_task(group.wait())
        await clock.settle()
        assert clock.pending() == [ranks.FOLLOWERS_STOP_S]  # its grace runs
        await clock.advance(ranks.FOLLOWERS_STOP_S - 0.1)
        assert group.followers[0].proc.returncode is None  # not killed before the grace is over
        await clock.advance(0.1)
        assert await asyncio.wait_for(waiting, 5) == 0
        assert group.followers[0].proc.returncode == -signal.SIGKILL

    asyncio.run(main())


REMOTE = ["127.0.0.1", {"host": "otherhost", "ip": "127.0.0.1"}]


@pytest.mark.parametrize("end", ["kill", "close stdin"])
def test_a_remote_rank_runs_through_ssh_and_ends_with_its_connection(end, fake_ranks, tmp_path, monkeypatch):
    """Rank 1 on "otherhost" is started through ``ssh`` (the fake one): it gets its config on stdin,
    MLX_RANK=1 and a private MLX_HOSTFILE holding the ring's hostfile. When the daemon's side goes
    (its ssh is killed, or the daemon's end of ssh's stdin closes) the remote rank's stdin reaches
    EOF and it exits."""
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    plan(monkeypatch, r0="sleep", r1="eof")
    cfg = config(REMOTE, ssh=f"{FAKE_SSH} -p 2222")
    assert cfg.distributed is not None and not cfg.distributed.hosts[1].local  # "otherhost" is remote

    async def main():
        group = await spawn(cfg, tmp_path / "state")
        got = await reports(fake_ranks, 2)
        assert log.read_text().split() == ["otherhost", "-p", "2222", *rank_launch.SSH_OPTIONS]
        remote = got[1]
        assert remote["rank"] == "1" and remote["config"]["model"] == "builtin:tiny"
        assert json.loads(remote["hostfile"]) == [["127.0.0.1:40500"], ["127.0.0.1:40501"]]
        assert remote["hostfile_mode"] == 0o600
        assert remote["hostfile_path"] != got[0]["hostfile_path"]  # written by the remote script
        assert remote["pid"] != group.followers[0].pid  # ssh stands between the daemon and the rank
        assert group.alive and not gone(remote["pid"])
        if end == "kill":
            group.followers[0].kill()
        else:
            stdin = group.followers[0].proc.stdin
            assert stdin is not None
            stdin.close()
        deadline = time.monotonic() + 5
        while not (fake_ranks / "rank1.eof").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (fake_ranks / "rank1.eof").exists(), "the remote rank never saw its stdin end"
        code = await asyncio.wait_for(group.wait(), 5)
        assert code == (-signal.SIGKILL if end == "kill" else 0)  # ssh's own code: the rank's, when it ran out
        while not gone(remote["pid"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert gone(remote["pid"])

    asyncio.run(main())


def test_is_this_host_treats_otherhost_as_remote():
    """The name the remote test uses is not taken for this machine."""
    from vllmmlxd.config.distributed import is_this_host

    assert not is_this_host("otherhost") and is_this_host("127.0.0.1") and is_this_host("localhost")
