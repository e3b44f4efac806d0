"""Form a distributed entry's group and agree on what it runs (the collectives of the handshake).

``handshake.py`` says what the ranks must agree on; this runs the one ``all_gather`` that
compares them, right after ``mx.distributed.init`` joined the group.
"""

from __future__ import annotations

import json
import logging
import os
import socket

import mlx.core as mx
import numpy as np

from ...config.schema import ResolvedModel
from ...log import log_event
from .handshake import HANDSHAKE_BYTES, Group, RankLost, RanksDisagree, disagreement, identity

logger = logging.getLogger("vllmmlxd.worker")


def join(config: ResolvedModel) -> Group:
    """Form the group and agree with the other ranks (raises ``RanksDisagree``)."""
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
