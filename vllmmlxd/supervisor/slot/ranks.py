"""A distributed entry's ranks, supervised as one worker.

The slot that supervises a model entry drives one worker; for a distributed entry that worker
is a ``RankGroup``: rank 0 is a worker like any other (the daemon's socket, the private health
socket, the config on stdin), the other ranks are followers started beside it, here or over
ssh. The group is what the slot sees: ready when rank 0 is (which is after every rank joined
and loaded its share), gone as soon as any rank is gone, after which the others are killed:
the slot's usual crash, backoff and stop rules then act on every rank at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ...log import event_line, log_event
from ..clock import REAL_CLOCK, Clock, done_within
from . import rank_launch
from .process import LogSink, SpawnError, UnitConfig, WorkerProcess

logger = logging.getLogger("vllmmlxd.supervisor")

FOLLOWERS_STOP_S = 5.0  # after rank 0's clean exit, the others' time to follow its stop frame


class RankGroup(WorkerProcess):
    """Rank 0's worker process, with the other ranks beside it (``followers``, rank 1 first)."""

    followers: list[WorkerProcess]
    hosts: list[str]
    first_exit: str | None = None  # which rank went first, and how
    clock: Clock = REAL_CLOCK  # the slot's: the others' time to follow rank 0's stop

    @classmethod
    async def spawn_group(
        cls,
        name: str,
        config: UnitConfig,
        *,
        state_dir: Path,
        log_level: str,
        sink: LogSink,
        clock: Clock = REAL_CLOCK,
        **how: Any,
    ) -> RankGroup:
        """Start the followers, then rank 0 as ``WorkerProcess.spawn`` starts a worker (``how``: the
        rest of its arguments: the socket, the drain timeout, the cores, the program). ``clock``: the
        slot's, which times the followers' grace after rank 0's clean stop."""
        dist = getattr(config, "distributed")  # noqa: B009 - a model entry's field, not on every UnitConfig
        files = rank_launch.rank_files(dist)
        paths = _write_files(state_dir, name, files)
        followers: list[WorkerProcess] = []
        try:
            for rank, host in enumerate(dist.hosts[1:], start=1):
                env = rank_launch.rank_env(dist, rank, paths)
                python = host.python or sys.executable
                if host.local:
                    argv = rank_launch.follower_argv(python, name, log_level, str(state_dir))
                    followers.append(
                        await WorkerProcess.start(name, config, argv, _no_socket(state_dir), sink, env=env)
                    )
                else:
                    remote_env = rank_launch.rank_env(dist, rank, {})
                    script = rank_launch.remote_script(
                        rank_launch.follower_argv(python, name, log_level), remote_env, files
                    )
                    argv = rank_launch.ssh_argv(dist.ssh, host.host, script)
                    followers.append(await WorkerProcess.start(name, config, argv, _no_socket(state_dir), sink))
            group = await cls.spawn(
                name,
                config,
                state_dir=state_dir,
                log_level=log_level,
                sink=sink,
                env=rank_launch.rank_env(dist, 0, paths),
                **how,
            )
        except (OSError, SpawnError):
            for f in followers:
                f.kill()
            await asyncio.gather(*(f.wait() for f in followers), return_exceptions=True)
            raise
        group._join(followers, [h.host for h in dist.hosts], clock)
        log_event(
            logger, "ranks.spawned", model=name, pids=",".join(str(p) for p in group.pids), hosts=",".join(group.hosts)
        )
        return group

    def _join(self, followers: list[WorkerProcess], hosts: list[str], clock: Clock) -> None:
        self.followers, self.hosts, self.clock = followers, hosts, clock

    @property
    def ranks(self) -> list[WorkerProcess]:
        return [self, *self.followers]

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.ranks]

    @property
    def alive(self) -> bool:
        return all(w.proc.returncode is None for w in self.ranks)

    async def _first_exit(self) -> tuple[int, int]:
        """The first rank to exit (the lowest of those gone at once) and its code."""
        waits = {asyncio.ensure_future(w.proc.wait()): r for r, w in enumerate(self.ranks)}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        first = min(done, key=lambda t: waits[t])
        return waits[first], first.result()

    async def exited(self) -> int:
        """Returns as soon as any rank has exited: that rank's code."""
        return (await self._first_exit())[1]

    async def wait(self) -> int:
        """Wait for the first rank to exit, end the others, and return the first one's code."""
        rank, code = await self._first_exit()
        if self.first_exit is None:
            self.first_exit = f"rank {rank} ({self.hosts[rank]}) exited with code {code}"
            if rank != 0 or code != 0:
                log_event(
                    logger,
                    "rank.exited",
                    logging.WARNING,
                    model=self.name,
                    rank=rank,
                    pid=self.ranks[rank].pid,
                    code=code,
                )
        if rank == 0 and code == 0:
            # Rank 0 drained and told the others to stop: they end on their own in a moment.
            followed = asyncio.gather(*(f.proc.wait() for f in self.followers))
            if not await done_within(self.clock, followed, FOLLOWERS_STOP_S):
                followed.cancel()
        for w in self.ranks:  # one rank gone: the others cannot go on
            w._signal(signal.SIGKILL)
        await asyncio.gather(*(f.wait() for f in self.followers), return_exceptions=True)
        await WorkerProcess.wait(self)
        self.exit_code = code
        return code

    def kill(self) -> None:
        for w in self.ranks:
            w._signal(signal.SIGKILL)

    def last_lines(self, n: int = 10) -> str:
        lines = [line for w in self.ranks for line in list(w.recent)]
        if self.first_exit:
            lines.append(event_line("rank.exited", "error", model=self.name, why=self.first_exit))
        return "\n".join(lines[-n:])


def _write_files(state_dir: Path, name: str, files: dict[str, str]) -> dict[str, str]:
    """Write each rank file once for the local ranks (private); their paths by variable."""
    run = state_dir / "run"
    run.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = {}
    for var, content in files.items():
        path = run / f"{name}-{var.lower()}-{os.getpid()}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        paths[var] = str(path)
    return paths


def _no_socket(state_dir: Path) -> Path:
    # A follower serves nothing: a path that never exists stands for its health socket.
    return state_dir / "run" / "no-socket"
