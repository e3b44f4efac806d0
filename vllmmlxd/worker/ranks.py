"""What every rank of a distributed entry does before it serves or follows: join, agree, load.

The daemon starts each rank with MLX's launcher contract in its environment (``MLX_RANK``,
``MLX_HOSTFILE`` for the ring; ``MLX_IBV_DEVICES`` and ``MLX_JACCL_COORDINATOR`` for jaccl), so
``mx.distributed.init(backend, strict=True)`` forms the group (strict: a missing variable is an
error, never a silent group of one). The ranks then agree on what they run, in one collective:
the same entry (its config hash), the same protocol and library versions; any difference ends
the rank with exit 3 (a config problem, not worth restarting) naming the rank and the field.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.schema import ResolvedModel
from ..engine.distributed.handshake import Group, RankLost, RanksDisagree  # noqa: F401 - raised by the ranks, caught by their mains

if TYPE_CHECKING:  # the loader imports mlx, which load_share brings in only when it runs
    from ..engine.loading.loader import LoadedModel

logger = logging.getLogger("vllmmlxd.worker")

EXIT_RANKS_DISAGREE = 3  # as a failed load: `failed` at once, no restart loop
EXIT_RANK_FAILED = 5  # the lockstep broke (a peer died, a frame was damaged): the unit restarts


def load_share(config: ResolvedModel, joined: Group, state_dir: Path) -> LoadedModel:
    from ..engine.distributed.shard_load import load_shard

    assert config.distributed is not None
    return load_shard(
        config.model,
        state_dir,
        joined.group,
        config.distributed.parallel,
        trust_remote_code=config.trust_remote_code,
    )
