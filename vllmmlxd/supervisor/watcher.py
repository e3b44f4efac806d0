"""Watch the config file and ask for a reload once per settled new content.

Editors save by writing a new file and renaming it over the old one, so the parent
directory is watched, not the file; a config that is a symlink is watched at both ends,
and watched anew when the link is pointed elsewhere. A burst of saves is one reload: once a
change is seen, the file is read only after ``settle_ms`` without another (watchfiles' own
grouping yields when its *set* of changed paths stops growing, and saving one file again adds
nothing to that set, so a long burst would be split). A save that leaves the content as it
was triggers none, and the content is compared with what was last acted on, so fixing a
broken file back to the running config clears the failure it caused. A deleted file is
reported (``on_missing``) and changes nothing. Nothing a reload raises stops the watch.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from watchfiles import awatch

from ..log import log_event

logger = logging.getLogger("vllmmlxd.watcher")


def file_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _named(names: set[str], _change: object, changed: str) -> bool:
    return Path(changed).name in names


async def watch_config(
    path: Path,
    settled: Callable[[str], bool],
    reload: Callable[[], Awaitable[object]],
    stop: asyncio.Event,
    on_missing: Callable[[bool], None] = lambda missing: None,
    settle_ms: int = 400,
    max_wait_ms: int = 3000,
) -> None:
    """Call ``reload`` when ``path``'s content is new and not ``settled`` (already running, no failure)."""
    path = path.absolute()
    last_seen = file_hash(path)
    missing = False
    while not stop.is_set():
        target = path.resolve()
        names = {path.name, target.name}
        dirs = sorted({str(path.parent), str(target.parent)})
        try:
            async for _ in awatch(
                *dirs,
                watch_filter=functools.partial(_named, names),
                debounce=max_wait_ms,
                step=settle_ms,
                stop_event=stop,
                recursive=False,
            ):
                await _quiet(path, settle_ms / 1000, max_wait_ms / 1000)
                digest = file_hash(path)
                if (digest is None) != missing:
                    missing = digest is None
                    on_missing(missing)
                if digest is not None and digest != last_seen:
                    last_seen = digest
                    if not settled(digest):
                        log_event(logger, "config.changed", path=str(path))
                        await _reload(reload)
                if path.resolve() != target:
                    break  # the link points elsewhere now: watch the new target's directory
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a directory that went away, an inotify limit: retry, never give up
            log_event(logger, "watcher.error", logging.WARNING, path=str(path), error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


async def _quiet(path: Path, settle_s: float, max_wait_s: float) -> None:
    """Until the file has not changed for ``settle_s`` (at most ``max_wait_s``): a burst, seen whole."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_s
    last, since = _stamp(path), loop.time()
    while loop.time() < deadline and loop.time() - since < settle_s:
        await asyncio.sleep(min(0.05, settle_s))
        now = _stamp(path)
        if now != last:
            last, since = now, loop.time()


async def _reload(reload: Callable[[], Awaitable[object]]) -> None:
    try:
        await reload()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the reload reports its own failures; this is a bug, and the watch goes on
        log_event(logger, "reload.crashed", logging.ERROR, error=_without_values(exc))


def _without_values(exc: Exception) -> str:
    """The exception for a log line; a validation error without the input values it would print (secrets)."""
    if hasattr(exc, "errors") and hasattr(exc, "error_count"):  # pydantic's ValidationError
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False, include_url=False)
        )
        return f"{type(exc).__name__}: {problems}"
    return f"{type(exc).__name__}: {exc}"
