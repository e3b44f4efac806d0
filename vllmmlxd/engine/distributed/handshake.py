"""What the ranks of a distributed entry must agree on before they run together (pure: no mlx).

The same entry (its config hash), the same frame protocol and the same vllmmlxd, mlx and
mlx-lm versions: ``engine/distributed/rank_group.py`` gathers each rank's ``identity`` once the group is
formed, and ``disagreement`` names the first rank that differs and in what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config.schema import ResolvedModel

HANDSHAKE_BYTES = 1024


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

    from ... import __version__
    from .lockstep import PROTOCOL

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
