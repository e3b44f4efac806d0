"""A model entry split over several ranks: ``distributed:`` (hosts, backend, how to split).

Rank r runs on ``hosts[r]``; rank 0 runs on this host, serves the entry's port and decides,
the other ranks follow it (``engine/distributed/lockstep.py``). The ranks find each other the way MLX's
own launcher sets them up: ring rank r listens on ``ip:port + r``; jaccl's coordinator is
rank 0's ``ip:port``. Everything that can be known before a rank starts is checked here, so
``vllmmlxctl check`` and a reload refuse a unit that could not run.
"""

from __future__ import annotations

import ipaddress
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from ..runtime.shard_families import ModelShape, folder_shape, kv_group_share, layer_share, split_problem
from .base import Strict
from .names import BUILTIN_PREFIX

DEFAULT_RING_PORT = 32323  # MLX's launcher's default starting port
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

# The builtins' shapes (their config.json; a test keeps these equal to the built folders).
BUILTIN_SHAPES = {
    "tiny": ModelShape("llama", layers=2, heads=4, kv_heads=2, intermediate=128),
    "smollm2-135m-instruct": ModelShape("llama", layers=30, heads=9, kv_heads=3, intermediate=1536),
}


# A host as ssh takes it: an optional user@, then a name or an address; never an option.
HOST_NAME = re.compile(
    r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.%]+\]|[0-9A-Fa-f:.]+)"
)


def is_this_host(host: str) -> bool:
    """Whether ``host`` names this machine without a network lookup (loopback, or its own name)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    name = socket.gethostname().lower()
    return host.lower() in {name, name.split(".")[0], name.split(".")[0] + ".local"}


class RankHost(Strict):
    """Where one rank runs."""

    host: str = Field(description="the host name ssh reaches; 127.0.0.1 (or this host) runs the rank here")
    ip: str | None = Field(None, description="the IPv4 address the ranks connect to (default: host, when an IP)")
    python: str | None = Field(None, description="vllmmlxd's Python on that host (default: this daemon's)")
    memory_mb: int | None = Field(None, ge=1, description="memory the rank may use there (default: asked at start)")
    rdma: tuple[str | None, ...] | None = Field(
        None, description="jaccl: this host's RDMA device towards each rank (null for itself)"
    )

    @field_validator("host")
    @classmethod
    def _a_host_name(cls, v: str) -> str:
        # It reaches ssh's command line: a name starting with "-" would be read as an option there
        # (-oProxyCommand=...), and spaces or quotes are no host's.
        if not HOST_NAME.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a host name or address (letters, digits, '.', '-', '_', ':', '[', ']', "
                "an optional user@, not starting with '-')"
            )
        return v

    @property
    def local(self) -> bool:
        return is_this_host(self.host)

    @property
    def address(self) -> str:
        """The address the ranks connect to: ``ip``, else the host when it is an address (else resolved at start)."""
        return self.ip or ("127.0.0.1" if self.host == "localhost" else self.host)


class DistributedConfig(Strict):
    hosts: tuple[RankHost, ...] = Field(description="one per rank, rank 0 (this host) first")
    backend: Literal["ring", "jaccl", "auto"] = Field(
        "auto", description="ring (TCP, every OS), jaccl (RDMA over Thunderbolt 5, macOS 26.2+), auto"
    )
    parallel: Literal["pipeline", "tensor"] = Field(
        "pipeline", description="pipeline: each rank runs some layers; tensor: each runs part of every layer"
    )
    port: int = Field(DEFAULT_RING_PORT, ge=1024, le=65000, description="ring: rank r listens on port + r")
    ssh: str = Field("ssh", description="the ssh client that starts remote ranks")

    @field_validator("hosts", mode="before")
    @classmethod
    def _names_are_hosts(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return tuple({"host": h} if isinstance(h, str) else h for h in v)
        return v

    @field_validator("hosts")
    @classmethod
    def _two_or_more_and_this_host_first(cls, v: tuple[RankHost, ...]) -> tuple[RankHost, ...]:
        if len(v) < 2:
            raise ValueError(
                "a distributed entry needs at least 2 hosts (rank 0 first); with one, leave distributed out"
            )
        if not v[0].local:
            raise ValueError(
                "rank 0 serves this entry's port on this daemon's socket, so it runs here: "
                "put 127.0.0.1 (or this host's name) first"
            )
        return v

    @model_validator(mode="after")
    def _reachable(self) -> Self:
        # Each rank connects to the others at their address: with a rank reached over the network,
        # a loopback address would send it to itself (a tunnel where every address is loopback is fine).
        if any(not h.local and not _is_loopback(h.address) for h in self.hosts):
            for i, h in enumerate(self.hosts):
                if _is_loopback(h.address):
                    raise ValueError(
                        f"hosts[{i}]: with ranks on other hosts, give the address they reach {h.host} at "
                        "(its Thunderbolt bridge or network address) as ip:"
                    )
        return self

    @model_validator(mode="after")
    def _backend_fits(self) -> Self:
        backend = self.resolved_backend()
        if backend == "jaccl" and (sys.platform != "darwin" or _macos_version() < (26, 2)):
            raise ValueError(
                f"jaccl needs macOS 26.2+ with RDMA over Thunderbolt (this host runs {platform.system().lower()} "
                f"{platform.mac_ver()[0] or platform.release()}); use backend: ring"
            )
        if backend == "ring":
            for i, h in enumerate(self.hosts):
                if _is_ipv6(h.address):
                    raise ValueError(f"hosts[{i}]: ring needs an IPv4 address (MLX opens AF_INET sockets)")
        return self

    def resolved_backend(self) -> str:
        """``auto``: jaccl where every host lists its RDMA devices on a Mac that has it, else ring."""
        if self.backend != "auto":
            if self.backend == "jaccl" and any(h.rdma is None for h in self.hosts):
                raise ValueError(
                    "jaccl needs each host's RDMA devices (rdma: one per rank, null for itself): "
                    "mlx.distributed_config --backend jaccl --over thunderbolt prints them"
                )
            return self.backend
        rdma = all(h.rdma is not None for h in self.hosts)
        return "jaccl" if rdma and sys.platform == "darwin" and _macos_version() >= (26, 2) else "ring"

    @property
    def world(self) -> int:
        return len(self.hosts)

    def ring_ports(self) -> list[tuple[str, int]]:
        """The (address, port) each rank listens on (ring: port + rank)."""
        return [(h.address, self.port + r) for r, h in enumerate(self.hosts)]


def _is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _is_ipv6(address: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address)
    except ValueError:
        return False  # a name: resolved when the unit starts


def _macos_version() -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in platform.mac_ver()[0].split(".") if p)
    except ValueError:
        return ()


def model_shape(model: str) -> ModelShape | None:
    """The shape of the model an entry names, when it is known before loading (builtins, local folders)."""
    if model.startswith(BUILTIN_PREFIX):
        return BUILTIN_SHAPES.get(model[len(BUILTIN_PREFIX) :])
    path = Path(model).expanduser()
    return folder_shape(path) if path.is_dir() else None


def distributed_problem(model: str, load: str, dist: DistributedConfig) -> str | None:
    """Why ``model`` cannot run as this distributed entry (checked when the config loads)."""
    if load == "lazy":
        return "load: lazy is not supported for a distributed entry yet: its ranks start with the daemon"
    remote = any(not h.local for h in dist.hosts)
    if model.lower().endswith(".gguf") and remote:
        return "a .gguf is converted on this host only: give remote ranks an MLX folder or a Hugging Face repo id"
    if model.startswith(BUILTIN_PREFIX) and model[len(BUILTIN_PREFIX) :] not in BUILTIN_SHAPES:
        return f"{model} cannot be split over ranks (an embedding model)"
    shape = model_shape(model)
    if shape is None:
        return None  # a hub id or a .gguf: each rank checks when it loads
    return split_problem(shape, dist.parallel, dist.world)


def share_text(model: str, dist: DistributedConfig, rank: int) -> str | None:
    """What part of the model rank ``rank`` holds, as status shows it ("layers 15-29 of 30", "heads 6 of 9")."""
    shape = model_shape(model)
    if shape is None:
        return None
    if dist.parallel == "pipeline":
        start, end = layer_share(shape.layers, dist.world, rank)
        return f"layers {start}-{end - 1} of {shape.layers}"
    if shape.heads % dist.world == 0 and shape.kv_heads % dist.world == 0:
        return f"heads {shape.heads // dist.world} of {shape.heads}"
    lo, hi = kv_group_share(shape.kv_heads, dist.world, rank)
    return f"heads {(hi - lo) * (shape.heads // shape.kv_heads)} of {shape.heads}"
