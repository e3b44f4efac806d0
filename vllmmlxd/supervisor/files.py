"""Whether each model unit's files are on this machine, and the pulls that bring them.

A model unit whose model is not here starts nothing: with ``download: true`` its pull is started
(or joined) and its end comes back to the supervisor's task as a ``Fetched`` message; else the
unit says what to run. A reload refused until a pull brings a changed entry's model runs again
once that pull is done (``PulledForReload``). Only the supervisor's task calls in here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import StoreError
from ..log import log_event
from ..store.layout import not_downloaded, pull_hint
from ..store.pulls import Pull, Pulls
from ..store.sources import Source
from . import messages as m
from .operations import Operations
from .units import Absent, ModelUnit, Unit
from .views import ActionReply

logger = logging.getLogger("vllmmlxd.supervisor")


class ModelFiles:
    def __init__(
        self,
        state_dir: Path,
        pulls: Pulls,
        ops: Operations,
        post: Callable[[m.Msg], None],
        changed: Callable[[], None],
    ) -> None:
        self.state_dir, self.pulls = state_dir, pulls
        self._ops, self._post, self._changed = ops, post, changed
        self._reload_after: set[str] = set()  # pulls a refused reload waits for: it runs again once they end

    def check(self, unit: Unit) -> None:
        """Mark a model unit whose model is not on this machine (it starts nothing until it is): with
        ``download: true`` its pull (started, or joined), else what to run. A unit with a worker keeps it."""
        if not isinstance(unit, ModelUnit) or unit.slot.pid is not None:
            return
        repo = not_downloaded(unit.config.model, self.state_dir)
        if repo is None:
            unit.absent = None
            return
        if unit.absent is not None and unit.absent.pull is not None and unit.absent.pull.running:
            return  # on its way already
        if not unit.config.download:
            unit.absent = Absent(repo, pull_hint(repo, unit.name))
            log_event(logger, "model.not_downloaded", logging.ERROR, model=unit.name, repo=repo, error=pull_hint(repo))
            return
        try:
            pull = self.pulls.start(Source(repo))
        except StoreError as exc:  # the same repo being pulled at another revision
            unit.absent = Absent(repo, str(exc))
            return
        unit.absent = Absent(repo, f"downloading {repo}", pull)
        log_event(logger, "model.downloading", model=unit.name, repo=repo, pull=pull.id)
        self._ops.track(self._when_fetched(unit.name, pull))

    async def _when_fetched(self, name: str, pull: Pull) -> None:
        await pull.wait()
        self._post(m.Fetched(name, pull))

    def absent_reply(self, unit: ModelUnit) -> ActionReply | None:
        """Before a start, restart or load: look again (pulled since?); why not, while its model is not here."""
        if unit.absent is None:
            return None
        self.check(unit)
        if unit.absent is None:
            self._changed()
            return None
        _, why = unit.absent.shown()
        return ActionReply(False, unit.name, why or f"{unit.absent.repo} is not here")

    def reload_when_pulled(self, pull: Pull) -> None:
        """A reload refused until ``pull`` brings a changed entry's model: run it again once it is done."""
        if pull.id in self._reload_after:
            return
        self._reload_after.add(pull.id)

        async def wait() -> None:
            final = await pull.wait()
            self._post(m.PulledForReload(pull.id, final.state == "done"))

        self._ops.track(wait())

    def pulled_for_reload(self, pull_id: str, done: bool) -> None:
        self._reload_after.discard(pull_id)
        if done:
            log_event(logger, "reload.after_download", pull=pull_id)
            self._post(m.Reload(future=None))
