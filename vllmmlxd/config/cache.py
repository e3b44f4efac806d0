"""An entry's ``cache_disk:`` section: the prefix cache's blocks on disk too."""

from __future__ import annotations

from pydantic import Field

from .base import Strict


class CacheDiskConfig(Strict):
    """``cache_disk: {dir: PATH, budget_gb: 20}``; ``cache_disk: {}`` takes the defaults."""

    dir: str | None = Field(
        None, description="where the blocks are written; unset: kv-cache/ in the state directory, shared by every entry"
    )
    budget_gb: float = Field(
        20.0, gt=0, description="this model's blocks on disk at most; the least recently used are deleted first"
    )
