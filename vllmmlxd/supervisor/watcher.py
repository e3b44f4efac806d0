"""Watch the config file and ask for a reload when its content changes.

Editors save by writing a new file and renaming it over the old one, so the parent
directory is watched, not the file. Changes within the debounce window are one
reload, and a save that leaves the content as it was triggers none.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Awaitable, Callable

from watchfiles import awatch

from ..log import log_event

logger = logging.getLogger("vllmmlxd.watcher")


def file_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


async def watch_config(
    path: Path,
    current_hash: Callable[[], str],
    reload: Callable[[], Awaitable[object]],
    stop: asyncio.Event,
    debounce_ms: int = 300,
) -> None:
    """Call ``reload`` whenever ``path``'s content differs from the running config's."""
    path = path.absolute()
    target = path.resolve()
    names = {path.name, target.name}
    last_tried: str | None = None

    def relevant(_change, changed: str) -> bool:
        return Path(changed).name in names

    dirs = {str(path.parent)} | {str(target.parent)}
    async for _ in awatch(*dirs, watch_filter=relevant, debounce=debounce_ms, step=50, stop_event=stop, recursive=False):
        digest = file_hash(path)
        if digest is None or digest == current_hash() or digest == last_tried:
            continue
        last_tried = digest
        log_event(logger, "config.changed", path=str(path))
        await reload()
