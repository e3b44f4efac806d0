"""Where vllmmlxd keeps its state: converted models, downloads, sockets, logs. Stdlib only."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_STATE_DIR = "VLLMMLXD_STATE_DIR"


def default_state_dir() -> Path:
    """The platform's default: ~/Library/Application Support/vllmmlxd or $XDG_STATE_HOME/vllmmlxd."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "vllmmlxd"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "vllmmlxd"


def resolve_state_dir(explicit: str | os.PathLike | None = None) -> Path:
    """``--state-dir`` (or the config's ``daemon.state_dir``), else $VLLMMLXD_STATE_DIR, else the default."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env).expanduser()
    return default_state_dir()


def models_dir(state_dir: Path) -> Path:
    return state_dir / "models"


def downloads_dir(state_dir: Path) -> Path:
    return state_dir / "downloads"
