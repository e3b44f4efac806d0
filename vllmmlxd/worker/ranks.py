"""What every rank of a distributed entry does before it serves or follows: join, agree, load.

The daemon starts each rank with MLX's launcher contract in its environment (``MLX_RANK``,
``MLX_HOSTFILE`` for the ring; ``MLX_IBV_DEVICES`` and ``MLX_JACCL_COORDINATOR`` for jaccl), so
``mx.distributed.init(backend, strict=True)`` forms the group (strict: a missing variable is an
error, never a silent group of one). The ranks then agree on what they run, in one collective:
the same entry (its config hash), the same protocol and library versions; any difference ends
the rank with exit 3 (a config problem, not worth restarting) naming the rank and the field.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.schema import ResolvedModel
from ..log import log_event

logger = logging.getLogger("vllmmlxd.worker")

HANDSHAKE_BYTES = 1024
EXIT_RANKS_DISAGREE = 3  # as a failed load: `failed` at once, no restart loop
EXIT_RANK_FAILED = 5  # the lockstep broke (a peer died, a frame was damaged): the unit restarts


class RanksDisagree(RuntimeError):
    pass


class RankLost(RuntimeError):
    """The group could not form (a rank did not connect in time): worth a restart."""


@dataclass
class Group:
    """A joined group and what each rank said at the handshake."""

    group: Any  # mx.distributed.Group
    ranks: list[dict]

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def world(self) -> int:
        return self.group.size()


def identity(config: ResolvedModel) -> dict:
    from importlib.metadata import version

    from .. import __version__
    from ..engine.lockstep import PROTOCOL

    return {
        "protocol": PROTOCOL,
        "vllmmlxd": __version__,
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "entry": config.config_hash(),
    }


def disagreement(said: list[dict]) -> str | None:
    """Which rank differs from rank 0, and in what (pure)."""
    first = said[0]
    for rank, other in enumerate(said[1:], start=1):
        for field in ("protocol", "vllmmlxd", "mlx", "mlx_lm", "entry"):
            if other.get(field) != first.get(field):
                return (
                    f"rank {rank} ({other.get('host')}) runs {field} {other.get(field)!r} "
                    f"where rank 0 runs {first.get(field)!r}"
                    + (": the ranks must run one entry of one config" if field == "entry" else "")
                )
    return None


def join(config: ResolvedModel) -> Group:
    """Form the group and agree with the other ranks (raises ``RanksDisagree``)."""
    import mlx.core as mx
    import numpy as np

    assert config.distributed is not None
    backend = config.distributed.resolved_backend()
    try:
        group = mx.distributed.init(backend=backend, strict=True)
    except RuntimeError as exc:
        raise RankLost(f"the ranks did not connect ({backend}): {exc}") from None
    if group.size() != config.distributed.world:
        raise RanksDisagree(f"the group has {group.size()} ranks; the entry names {config.distributed.world}")
    mine = {**identity(config), "rank": group.rank(), "pid": os.getpid(), "host": socket.gethostname()}
    raw = json.dumps(mine).encode().ljust(HANDSHAKE_BYTES, b" ")[:HANDSHAKE_BYTES]
    try:
        gathered = mx.distributed.all_gather(mx.array(np.frombuffer(raw, dtype=np.uint8)), group=group, stream=mx.cpu)
        mx.eval(gathered)
    except RuntimeError as exc:
        raise RankLost(f"a rank left during the handshake: {exc}") from None
    data = np.array(gathered).tobytes()
    said = [json.loads(data[r * HANDSHAKE_BYTES : (r + 1) * HANDSHAKE_BYTES]) for r in range(group.size())]
    problem = disagreement(said)
    if problem:
        raise RanksDisagree(problem)
    log_event(logger, "rank.joined", rank=group.rank(), world=group.size(), backend=backend)
    return Group(group, said)


def load_share(config: ResolvedModel, joined: Group, state_dir: Path):
    from ..engine.shard_load import load_shard

    assert config.distributed is not None
    return load_shard(
        config.model,
        state_dir,
        joined.group,
        config.distributed.parallel,
        trust_remote_code=config.trust_remote_code,
    )


def share_text(config: ResolvedModel, rank: int) -> str | None:
    """What part of the model rank ``rank`` holds, as status shows it ("layers 15-29 of 30", "heads 6 of 9")."""
    from ..config.distributed import model_shape
    from ..runtime.shard_families import kv_group_share, layer_share

    dist = config.distributed
    shape = model_shape(config.model)
    if dist is None or shape is None:
        return None
    if dist.parallel == "pipeline":
        start, end = layer_share(shape.layers, dist.world, rank)
        return f"layers {start}-{end - 1} of {shape.layers}"
    if shape.heads % dist.world == 0 and shape.kv_heads % dist.world == 0:
        return f"heads {shape.heads // dist.world} of {shape.heads}"
    lo, hi = kv_group_share(shape.kv_heads, dist.world, rank)
    return f"heads {(hi - lo) * (shape.heads // shape.kv_heads)} of {shape.heads}"
