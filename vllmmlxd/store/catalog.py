"""What the store holds: each model's name, source, size and the entries that use it; removing one.

The models dir holds three kinds of folder, each complete once its marker is written: pulled hub
repos (``hub-org--name``), builtins (``builtin-NAME-vN``) and converted GGUF files (``gguf-<sha256>``).
An interrupted pull's files wait in the downloads dir (``partial``) until a pull of the same repo
resumes them. A model is named as a config's ``model:`` names it (``org/name``, ``builtin:tiny``),
else by its folder (``gguf-1a2b...``, an older builtin version).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllmmlxd.config.names import BUILTIN_PREFIX, hub_repo_id
from vllmmlxd.errors import StoreError
from vllmmlxd.paths import downloads_dir, models_dir

from .disk import format_bytes
from .layout import MARKER, read_marker, repo_of, store_copy

GGUF_DIGESTS = ".gguf-digests"  # engine/loading/gguf.py's memo of each GGUF file's sha256 (path, size, mtime)


class NotInStore(StoreError):
    """No model of that name in the store."""


@dataclass(frozen=True)
class StoredModel:
    """One model in the store, as ``vllmmlxctl models`` lists it."""

    name: str  # what `rm` takes, and for a pulled repo or a builtin what `model:` takes
    kind: str  # pulled, builtin, gguf, partial (an interrupted pull's files), other
    source: str  # where it came from, in words
    path: str
    size_bytes: int
    revision: str | None = None
    commit: str | None = None
    created: str | None = None  # when it was pulled or built (UTC, from its marker)
    used_by: tuple[str, ...] = field(default_factory=tuple)  # the running config's entries that load it


def list_models(
    state_dir: Path, entries: Mapping[str, Sequence[str]] = {}, pulling: frozenset[str] = frozenset()
) -> list[StoredModel]:
    """Everything in the store, pulled repos first; ``entries``: each entry's model specs (model,
    embedding model), to say which use what; ``pulling``: the repos being pulled now."""
    store = models_dir(state_dir)
    users = _users(state_dir, entries)
    found: list[StoredModel] = []
    for folder in sorted(_dirs(store)):
        if not (folder / MARKER).is_file():
            continue  # being built or pulled: not in the store yet
        found.append(_describe(folder, state_dir, users.get(folder.resolve(), ())))
    for work in sorted(_dirs(downloads_dir(state_dir) / "hub")):
        repo = repo_of(work.name)
        if repo is not None and any(f.is_file() for f in work.rglob("*") if ".cache" not in f.parts):
            source = (
                "being pulled now"
                if repo in pulling
                else f"an interrupted pull of {repo}: `vllmmlxctl pull {repo}` resumes it"
            )
            found.append(StoredModel(repo, "partial", source, str(work), _size(work)))
    order = {"pulled": 0, "partial": 1, "builtin": 2, "gguf": 3}
    return sorted(found, key=lambda m: (order.get(m.kind, 4), m.name))


def _describe(folder: Path, state_dir: Path, used_by: tuple[str, ...]) -> StoredModel:
    marker = read_marker(folder)
    size, path, created = _size(folder), str(folder), marker.get("pulled") or marker.get("built")
    repo = repo_of(folder.name)
    if repo is not None:
        revision, commit = marker.get("revision"), marker.get("commit")
        at = f" ({revision})" if revision else ""
        source = f"{repo}{at} @ {str(commit)[:12]}" if commit else repo
        return StoredModel(repo, "pulled", source, path, size, revision, commit, created, used_by)
    if folder.name.startswith("builtin-"):
        builtin = _builtin_name(folder.name)
        current = builtin is not None and current_builtin(builtin, state_dir) == folder
        name = BUILTIN_PREFIX + builtin if current and builtin else folder.name
        source = "built here" if current else f"an older build of {BUILTIN_PREFIX}{builtin}, no longer used"
        return StoredModel(name, "builtin", source, path, size, created=created, used_by=used_by)
    if folder.name.startswith("gguf-"):
        gguf = _gguf_sources(state_dir).get(folder.name[len("gguf-") :])
        source = f"converted from {gguf}" if gguf else "converted from a GGUF file"
        return StoredModel(folder.name, "gguf", source, path, size, created=created, used_by=used_by)
    return StoredModel(folder.name, "other", "", path, size, created=created, used_by=used_by)


def current_builtin(name: str, state_dir: Path) -> Path | None:
    """The newest complete build of builtin ``name`` (what a worker loads)."""
    built = [p.parent for p in models_dir(state_dir).glob(f"builtin-{name}-v*/{MARKER}")]
    built = [p for p in built if _builtin_name(p.name) == name]
    return max(built, key=_version) if built else None


def _builtin_name(folder: str) -> str | None:
    head, _, version = folder[len("builtin-") :].rpartition("-v")
    return head if head and version.isdigit() else None


def _version(folder: Path) -> int:
    tail = folder.name.rpartition("-v")[2]
    return int(tail) if tail.isdigit() else -1


def uses(spec: str, state_dir: Path) -> Path | None:
    """The store folder a ``model:`` spec loads, if it loads one from the store."""
    if spec.startswith(BUILTIN_PREFIX):
        return current_builtin(spec[len(BUILTIN_PREFIX) :], state_dir)
    repo = hub_repo_id(spec)
    if repo is not None and not Path(spec).expanduser().is_dir():
        return store_copy(repo, state_dir)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        digest = _gguf_digest(path, state_dir)
        folder = models_dir(state_dir) / f"gguf-{digest[:16]}" if digest else None
        return folder if folder is not None and folder.is_dir() else None
    return path if path.is_dir() else None


def _users(state_dir: Path, entries: Mapping[str, Sequence[str]]) -> dict[Path, tuple[str, ...]]:
    users: dict[Path, list[str]] = {}
    for entry, specs in entries.items():
        for spec in specs:
            folder = uses(spec, state_dir) if spec else None
            if folder is not None and entry not in users.setdefault(folder.resolve(), []):
                users[folder.resolve()].append(entry)
    return {folder: tuple(names) for folder, names in users.items()}


def _gguf_memos(state_dir: Path) -> list[dict]:
    memos = []
    for path in (models_dir(state_dir) / GGUF_DIGESTS).glob("*.json"):
        try:
            memo = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(memo, dict) and isinstance(memo.get("sha256"), str):
            memos.append(memo)
    return memos


def _gguf_sources(state_dir: Path) -> dict[str, str]:
    """Each converted GGUF's sha256 prefix → the file it was converted from (as remembered)."""
    return {m["sha256"][:16]: str(m.get("path")) for m in _gguf_memos(state_dir)}


def _gguf_digest(path: Path, state_dir: Path) -> str | None:
    """The remembered sha256 of this version of a GGUF file (engine/loading/gguf.py hashed it when it converted it)."""
    try:
        resolved = path.resolve()
        info = resolved.stat()
    except OSError:
        return None
    version = f"{resolved}\0{info.st_size}\0{info.st_mtime_ns}"
    return next((m["sha256"] for m in _gguf_memos(state_dir) if m.get("version") == version), None)


def _dirs(parent: Path) -> list[Path]:
    try:
        return [p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _size(folder: Path) -> int:
    total = 0
    for p in folder.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total


# -- removing one -----------------------------------------------------------------------------------


def removal_refusal(name: str, found: Sequence[StoredModel], pulling: bool) -> str | None:
    """Why ``name`` may not be removed now (used by an entry, being pulled), or None. Pure."""
    used = sorted({e for m in found for e in m.used_by})
    if used:
        which = ", ".join(used)
        return (
            f"{name} is in use by {which}: remove {'that entry' if len(used) == 1 else 'those entries'} "
            "from the config (or give it another model) and reload first"
        )
    if pulling:
        return f"{name} is being pulled: cancel it first (vllmmlxctl pull --cancel {name})"
    return None


def remove_model(name: str, state_dir: Path, entries: Mapping[str, Sequence[str]], pulling: bool) -> list[StoredModel]:
    """Delete the model ``name`` (every folder of it: a pulled copy and an interrupted pull's files);
    what was removed. ``StoreError`` when there is none of that name, or it may not go (``removal_refusal``)."""
    models = list_models(state_dir, entries)
    found = [m for m in models if name in (m.name, Path(m.path).name)]
    if not found:
        known = ", ".join(m.name for m in models) or "none"
        raise NotInStore(f"no model {name!r} in the store (it holds: {known})")
    why = removal_refusal(found[0].name, found, pulling)
    if why:
        raise StoreError(why)
    for model in found:
        folder = Path(model.path)
        # Out of sight in one rename, then deleted: a crash midway leaves no half model under its name.
        gone = folder.with_name(f".tmp-rm-{folder.name}-{os.getpid()}")
        os.rename(folder, gone)
        shutil.rmtree(gone, ignore_errors=True)
    return found


def describe_removal(removed: Sequence[StoredModel]) -> str:
    """``removed org/name (1.21 GB)``."""
    total = sum(m.size_bytes for m in removed)
    return f"removed {removed[0].name} ({format_bytes(total)})"
