"""What arrives on the supervisor's queue: one frozen dataclass per message, handled by ``match``.

Calls from the control API carry the future they are answered through; news (a unit changed, an
operation ended, a pull finished, a tick) carries only its facts. Nothing else is ever queued.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.schema import DaemonConfig
    from ..store.pulls import Pull


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


@dataclass(frozen=True)
class Call:
    """A control call: answered once through ``future`` (a reply, or the exception that stopped it);
    None for one the supervisor makes itself (a reload once a pull it waited for is done)."""

    future: asyncio.Future[Any] | None = field(default_factory=_future, kw_only=True)


@dataclass(frozen=True)
class NamedCall(Call):
    name: str


# -- calls ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartAll(Call):
    """Create every unit and start the eager ones; answered once each is ready or failed."""


@dataclass(frozen=True)
class Reload(Call):
    dry_run: bool = False
    file: str | None = None  # preview this file against what runs (dry runs only)


@dataclass(frozen=True)
class Load(NamedCall):
    """Make a model serve (the gateway asks for a request that needs it)."""


@dataclass(frozen=True)
class Start(NamedCall):
    pass


@dataclass(frozen=True)
class Stop(NamedCall):
    pass


@dataclass(frozen=True)
class Restart(NamedCall):
    pass


@dataclass(frozen=True)
class Shutdown(Call):
    pass


# -- news ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Changed:
    """Some unit's state changed (one message however many changes came at once)."""


@dataclass(frozen=True)
class OpDone:
    op_id: int
    result: object
    error: BaseException | None


@dataclass(frozen=True)
class UseDaemonConfig:
    daemon: DaemonConfig


@dataclass(frozen=True)
class ConfigMissing:
    missing: bool


@dataclass(frozen=True)
class Fetched:
    """A unit's pull ended (done or not)."""

    name: str
    pull: Pull


@dataclass(frozen=True)
class PulledForReload:
    """A pull a refused reload waited for ended."""

    pull_id: str
    done: bool


@dataclass(frozen=True)
class Published:
    """The gateway's routing table was handed over (or the push failed)."""

    content: str
    ok: bool


@dataclass(frozen=True)
class Demand:
    """A request on an unloaded lazy model's own port."""

    name: str


@dataclass(frozen=True)
class IdleTick:
    """The idle ticker: time to look for idle lazy models."""


Calls = StartAll | Reload | Load | Start | Stop | Restart | Shutdown
News = Changed | OpDone | UseDaemonConfig | ConfigMissing | Fetched | PulledForReload | Published | Demand | IdleTick
Msg = Calls | News
