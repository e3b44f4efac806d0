"""Where a model is on disk: the store's copy of a hub repo, else huggingface_hub's own cache. Stdlib only.

The store is ``models_dir(state_dir)``, shared with the builtins and converted GGUF files: a pulled
repo ``org/name`` is the folder ``hub-org--name`` (the hub refuses ``--`` in names, so the name reads
back), complete once its marker is written, last, holding where it came from. A pull fills
``downloads_dir(state_dir)/hub/<folder>`` and renames it into the store when every file checks out,
so the store never holds half a model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vllmmlxd.config.names import hub_repo_id
from vllmmlxd.paths import downloads_dir, models_dir

MARKER = ".vllmmlxd-complete"  # written last into a finished folder (as engine/loading/gguf.py's builds do)
PULLED_PREFIX = "hub-"


def folder_name(repo: str) -> str:
    """The store's folder for ``org/name``: ``hub-org--name``."""
    return PULLED_PREFIX + repo.replace("/", "--", 1)


def repo_of(folder: str) -> str | None:
    """The repo id a store folder holds (``hub-org--name`` → ``org/name``), or None for another folder."""
    if not folder.startswith(PULLED_PREFIX) or "--" not in folder:
        return None
    repo = folder[len(PULLED_PREFIX) :].replace("--", "/", 1)
    return repo if hub_repo_id(repo) == repo else None


def store_copy(repo: str, state_dir: Path) -> Path | None:
    """The store's complete copy of ``repo`` (pulled), or None."""
    folder = models_dir(state_dir) / folder_name(repo)
    return folder if (folder / MARKER).is_file() else None


def work_folder(repo: str, state_dir: Path) -> Path:
    """Where a pull of ``repo`` downloads to (and an interrupted one left what it finished)."""
    return downloads_dir(state_dir) / "hub" / folder_name(repo)


def read_marker(folder: Path) -> dict:
    """What a complete folder's marker says (empty when it has none or it is unreadable)."""
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE, $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "huggingface" / "hub"


def hub_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The downloaded snapshot of ``repo_id`` in huggingface_hub's cache (refs/main's, else the newest), or None."""
    repo = (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    try:
        main = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
        if main.is_dir():
            return main
    except OSError:
        pass
    snapshots = [p for p in (repo / "snapshots").glob("*") if p.is_dir()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def hub_folder(repo: str, state_dir: Path) -> Path | None:
    """Where the files of hub repo ``repo`` are here: the store's copy first, else the hub cache's snapshot."""
    return store_copy(repo, state_dir) or hub_snapshot(repo)


def not_downloaded(spec: str, state_dir: Path) -> str | None:
    """The repo id when a ``model:`` spec names a hub repo that is neither in the store nor in the hub
    cache (a worker would have to download it), else None (a builtin, a path, or a model that is here)."""
    repo = hub_repo_id(spec)
    if repo is None or Path(spec).expanduser().is_dir():  # a folder of that name wins, as in the loader
        return None
    return None if hub_folder(repo, state_dir) is not None else repo


def pull_hint(repo: str, entry: str | None = None) -> str:
    """What to run for a model that is not downloaded (``entry``: the config entry that names it)."""
    then = f", then `vllmmlxctl start {entry}`" if entry else ""
    set_it = f" (or set download: true on {entry} to have the daemon download it)" if entry else ""
    return f"{repo} is not downloaded: run `vllmmlxctl pull {repo}`{then}{set_it}"
