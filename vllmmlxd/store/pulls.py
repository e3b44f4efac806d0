"""The daemon's pulls: one per repo at a time, each a child process whose lines become its state.

Whoever asks for a model (``vllmmlxctl pull``, an entry with ``download: true``, the gateway's Ollama
``/api/pull``) gets the same ``Pull``: a second request for a repo being pulled joins it. A pull
belongs to the daemon, not to who asked: a follower that goes away stops following, never the
download (``cancel`` does). Each pull's state is written by its own task only (reading the child's
``fetch.py`` lines); followers read ``view()`` snapshots, woken at each change.

At most ``max_running`` pulls run at once (each a child process and a share of the network);
more wait, ``queued``, first come first served, and past ``max_queued`` waiting a new one is
refused (``StoreBusy``): no caller starts pulls without bound. Disk admission happens in one
place at a time: a pull's child lists the repo, then asks the daemon (on stdin) what the other
admitted pulls still have to write, and answers ``admitted`` or refused before the next pull is
asked; so two pulls started at once are never admitted against the same free space.

Why a child process: a cancelled or shut-down pull is a killed process (a thread in the middle of
``snapshot_download`` cannot be stopped, and would hold the daemon's exit until its file ends), and
huggingface_hub and its HTTP stack stay out of the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vllmmlxd.errors import StoreBusy, StoreError
from vllmmlxd.log import log_event

from .progress import Rate, eta_s, percent
from .sources import Source

logger = logging.getLogger("vllmmlxd.store")

PullState = Literal["queued", "resolving", "downloading", "verifying", "installing", "done", "failed", "cancelled"]
ENDED: frozenset[str] = frozenset({"done", "failed", "cancelled"})
KEEP_ENDED = 20  # ended pulls kept for status and late followers, newest last
STOP_GRACE_S = 5.0
MAX_RUNNING = 2  # pulls downloading at once (the daemon section's max_pulls)
MAX_QUEUED = 8  # pulls waiting for one of those (max_waiting_pulls); more are refused


@dataclass(frozen=True)
class PullView:
    """A pull as its followers see it: plain data (the control API's ``PullStatus``)."""

    id: str
    repo: str
    revision: str | None  # as asked; None: the repo's default branch
    state: PullState
    commit: str | None = None  # the commit the revision was at
    total_bytes: int | None = None  # of the files it downloads (known once listed)
    done_bytes: int = 0  # on disk, with what an interrupted pull had finished
    files: int | None = None
    percent: float | None = None
    bytes_per_s: float | None = None  # over the last few seconds
    eta_s: float | None = None
    started_at: float = 0.0  # unix time
    ended_at: float | None = None
    error: str | None = None
    refused: bool = False  # refused before downloading (not an MLX folder, not enough disk)
    missing: bool = False  # the hub has no such repo or revision
    path: str | None = None  # the store's folder, once installed
    already: bool = False  # that commit was in the store already: nothing was downloaded

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class Pull:
    """One pull: its child process's lines become its state (written by its own task only)."""

    def __init__(self, pull_id: str, source: Source, state: PullState = "resolving"):
        self.id = pull_id
        self.source = source
        self.state: PullState = state
        self.commit: str | None = None
        self.total: int | None = None
        self.done = 0
        self.files: int | None = None
        self.error: str | None = None
        self.refused = False
        self.missing = False
        self.path: str | None = None
        self.already = False
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.rate = Rate()
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None
        self._version = 0
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self.turn = asyncio.Event()  # set once it may run (at once, or when a running pull ends)
        if state != "queued":
            self.turn.set()

    @property
    def repo(self) -> str:
        return self.source.repo

    @property
    def running(self) -> bool:
        return self.state not in ENDED

    def view(self) -> PullView:
        per_s = self.rate.per_s() if self.state == "downloading" else None
        return PullView(
            id=self.id,
            repo=self.repo,
            revision=self.source.revision,
            state=self.state,
            commit=self.commit,
            total_bytes=self.total,
            done_bytes=self.done,
            files=self.files,
            percent=percent(self.done, self.total),
            bytes_per_s=round(per_s, 1) if per_s is not None else None,
            eta_s=round(e, 1) if (e := eta_s(self.done, self.total, per_s)) is not None else None,
            started_at=self.started_at,
            ended_at=self.ended_at,
            error=self.error,
            refused=self.refused,
            missing=self.missing,
            path=self.path,
            already=self.already,
        )

    async def wait(self) -> PullView:
        """Its final view, once it has ended."""
        await self._finished.wait()
        return self.view()

    async def follow(self) -> AsyncIterator[PullView]:
        """Its view now, then at each change, ending with its final view."""
        seen = -1
        while True:
            wake = self._wake  # taken before the check: a change in between is not missed
            if self._version != seen:
                seen = self._version
                view = self.view()
                yield view
                if view.ended:
                    return
            else:
                await wake.wait()

    # -- written by its own task ---------------------------------------------------------------

    def apply(self, line: dict) -> None:
        """One line of the child's (``fetch.py``'s events)."""
        event = line.get("event")
        # The rate is timed by when the child counted the bytes: a busy reader takes its lines late, and bunched.
        at = float(line["t"]) if isinstance(line.get("t"), (int, float)) else time.monotonic()
        if event == "listed":
            self.commit, self.total, self.files = line.get("commit"), line.get("total"), line.get("files")
            self.done = int(line.get("have") or 0)
            self.state = "downloading"
            self.rate.add(at, self.done)
        elif event == "progress":
            self.done = int(line.get("done") or 0)
            self.rate.add(at, self.done)
        elif event in ("verifying", "installing"):
            self.state = event
        elif event == "done":
            self.path, self.already = line.get("path"), bool(line.get("already"))
            self.total = line.get("total", self.total)
            self.done = self.total or self.done
            self.end("done")
            return
        elif event == "failed":
            self.error, self.refused = str(line.get("error") or "failed"), bool(line.get("refused"))
            self.missing = bool(line.get("missing"))
            self.end("failed")
            return
        self.changed()

    def end(self, state: PullState, error: str | None = None) -> None:
        if not self.running:
            return
        self.state, self.ended_at = state, time.time()
        self.error = error or self.error
        self._finished.set()
        self.changed()

    def changed(self) -> None:
        self._version += 1
        self._wake.set()
        self._wake = asyncio.Event()


class Pulls:
    """Every pull of this daemon: the running ones, and the last ended ones (see the module)."""

    def __init__(
        self,
        state_dir: Path,
        python: str = sys.executable,
        keep_ended: int = KEEP_ENDED,
        max_running: int = MAX_RUNNING,
        max_queued: int = MAX_QUEUED,
    ):
        self.state_dir = state_dir
        self.python = python
        self.max_running, self.max_queued = max_running, max_queued
        self._pulls: dict[str, Pull] = {}
        self._ended: deque[str] = deque()
        self._keep_ended = keep_ended
        self._seq = itertools.count(1)
        self._admission = asyncio.Lock()  # one disk admission at a time (see the module)

    def limit(self, max_running: int, max_queued: int) -> None:
        """New caps (a reload); a higher one lets waiting pulls go at once."""
        self.max_running, self.max_queued = max_running, max_queued
        self._promote()

    def start(self, source: Source) -> Pull:
        """Start pulling ``source`` (now, or queued behind the running ones), or join the pull of that
        repo under way; ``StoreError`` when one under way pulls another revision, ``StoreBusy`` when
        too many wait already."""
        running = self.running(source.repo)
        if running is not None:
            if running.source.revision != source.revision:
                raise StoreError(
                    f"{running.source.render()} is being pulled ({running.id}): wait for it, "
                    f"or cancel it (vllmmlxctl pull --cancel {running.repo}) to pull {source.render()}"
                )
            return running
        queued = self._queued()
        now = not queued and len(self._active()) < self.max_running
        if not now and len(queued) >= self.max_queued:
            raise StoreBusy(
                f"{len(self._active())} pulls are running and {len(queued)} waiting (max_pulls: "
                f"{self.max_running}, max_waiting_pulls: {self.max_queued}): pull {source.render()} once some have ended"
            )
        pull = Pull(f"{next(self._seq)}-{secrets.token_hex(3)}", source, "resolving" if now else "queued")
        self._pulls[pull.id] = pull
        pull.task = asyncio.get_running_loop().create_task(self._run(pull), name=f"pull-{pull.id}")
        return pull

    def _active(self) -> list[Pull]:
        return [p for p in self._pulls.values() if p.running and p.state != "queued"]

    def _queued(self) -> list[Pull]:
        return [p for p in self._pulls.values() if p.state == "queued"]  # in order of arrival

    def _promote(self) -> None:
        """Let waiting pulls run, first come first served, while there are slots (on the event loop)."""
        for pull in self._queued()[: max(self.max_running - len(self._active()), 0)]:
            pull.state = "resolving"
            pull.turn.set()
            pull.changed()

    def get(self, pull_id: str) -> Pull:
        """The pull with that id (running, or among the last ended); KeyError otherwise."""
        return self._pulls[pull_id]

    def running(self, repo: str) -> Pull | None:
        """The pull of ``repo`` under way, if any."""
        return next((p for p in self._pulls.values() if p.repo == repo and p.running), None)

    def all(self) -> list[Pull]:
        """Running and recently ended pulls, oldest first."""
        return sorted(self._pulls.values(), key=lambda p: p.started_at)

    async def cancel(self, pull_id: str) -> PullView:
        """Stop a running pull (the files it finished stay for the next one); its view."""
        pull = self.get(pull_id)
        if pull.state == "queued" and pull.task is not None:
            # Ended here, not by a cancel: a task cancelled before its first step runs no finally.
            pull.end("cancelled", "cancelled")
            pull.turn.set()  # its task wakes, sees it ended, and leaves the queue
            await pull.task
        elif pull.running and pull.task is not None:
            pull.task.cancel()  # its own task stops the child and ends it "cancelled"
            with contextlib.suppress(asyncio.CancelledError):
                await pull.task
        return pull.view()

    async def close(self) -> None:
        """At the daemon's end: stop every running pull."""
        running = [p for p in self._pulls.values() if p.running]
        await asyncio.gather(*(self.cancel(p.id) for p in running), return_exceptions=True)

    def _reserved(self, but: Pull) -> int:
        """What the other running pulls still have to write (disk admission counts it as taken): every
        admitted pull's size is known, since admission takes one pull at a time, after its listing."""
        return sum(max((p.total or 0) - p.done, 0) for p in self._pulls.values() if p.running and p is not but)

    async def _run(self, pull: Pull) -> None:
        """The pull's own task: wait for its turn, run the child, read its lines into the pull, end it."""
        stderr: deque[str] = deque(maxlen=20)
        started = time.monotonic()
        try:
            await pull.turn.wait()
            if not pull.running:
                return  # cancelled while it waited
            log_event(logger, "pull.started", id=pull.id, repo=pull.repo, revision=pull.source.revision)
            argv = [self.python, "-m", "vllmmlxd.store.fetch", "--state-dir", str(self.state_dir)]
            argv += ["--repo", pull.repo, "--reserved", "-"]
            argv += ["--revision", pull.source.revision] if pull.source.revision else []
            async with self._admission:  # until this pull is admitted or has ended
                proc = await _spawn(pull, argv)
                assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
                drain = asyncio.create_task(_keep_tail(proc.stderr, stderr))
                async for line in _lines(proc.stdout):
                    pull.apply(line)
                    if line.get("event") == "listed":
                        proc.stdin.write(json.dumps({"reserved": self._reserved(pull)}).encode() + b"\n")
                        with contextlib.suppress(ConnectionError):
                            await proc.stdin.drain()
                    if line.get("event") in ("admitted", "done", "failed"):
                        break
            async for line in _lines(proc.stdout):
                pull.apply(line)
            await proc.wait()
            await drain
        except OSError as exc:
            pull.end("failed", f"cannot start the download: {exc}")
        except asyncio.CancelledError:
            await self._stop(pull)
            pull.end("cancelled", "cancelled")
            raise
        finally:
            if pull.running:  # the child ended without saying how: its last words say why
                pull.end("failed", _redact(_last_words(stderr) or f"the download exited with {_code(pull)}"))
            self._ended_one(pull)
            self._promote()
            _log_end(pull, time.monotonic() - started)

    async def _stop(self, pull: Pull) -> None:
        proc = pull.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    def _ended_one(self, pull: Pull) -> None:
        self._ended.append(pull.id)
        while len(self._ended) > self._keep_ended:
            self._pulls.pop(self._ended.popleft(), None)


async def _spawn(pull: Pull, argv: list[str]) -> asyncio.subprocess.Process:
    """Start the pull's child. A cancel while it starts waits for it to be started, so that it can be
    stopped: cancelling asyncio's half-made process itself can wait forever for it to end."""
    creating = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the daemon's terminal is the daemon's to handle
            env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        )
    )
    try:
        pull.proc = await asyncio.shield(creating)
    except asyncio.CancelledError:
        pull.proc = await creating
        raise
    return pull.proc


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[dict]:
    """The child's JSON lines (anything else skipped), until it closes its stdout."""
    async for raw in stream:
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            if isinstance(line, dict):
                yield line


async def _keep_tail(stream: asyncio.StreamReader, tail: deque[str]) -> None:
    async for raw in stream:
        tail.append(raw.decode(errors="replace").rstrip())


def _last_words(lines: deque[str]) -> str:
    said = [line for line in lines if line.strip()]
    return said[-1] if said else ""


def _code(pull: Pull) -> int | None:
    return pull.proc.returncode if pull.proc is not None else None


def _redact(text: str) -> str:
    """A child's own words with the hub token left out (the child redacts its errors; a crash does not)."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        secret = os.environ.get(name)
        if secret and len(secret) >= 8:
            text = text.replace(secret, "<token>")
    return text


def _log_end(pull: Pull, seconds: float) -> None:
    view = pull.view()
    level = logging.INFO if view.state == "done" else logging.WARNING
    log_event(
        logger,
        f"pull.{view.state}",
        level,
        id=view.id,
        repo=view.repo,
        commit=view.commit,
        bytes=view.total_bytes,
        path=view.path,
        error=view.error if view.state != "done" else None,
        seconds=round(seconds, 1),
    )
