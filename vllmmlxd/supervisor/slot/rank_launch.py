"""How each rank of a distributed entry is started: MLX's launcher contract, as pure functions.

MLX's launcher (``mlx.launch``) gives rank r the variable ``MLX_RANK=r`` and, for the ring
backend, ``MLX_HOSTFILE``: a JSON list, one list of ``ip:port`` per rank, where rank r listens
on the starting port + r. For jaccl it gives ``MLX_IBV_DEVICES`` (a file with each host's RDMA
devices towards every rank) and ``MLX_JACCL_COORDINATOR`` (rank 0's ``ip:port``). vllmmlxd
starts the ranks itself, with the same variables: rank 0 as its worker on the daemon's socket,
the others as followers, here or over ssh. The daemon never imports mlx: this is the contract
restated, not the launcher called.
"""

from __future__ import annotations

import json
import shlex

from ...config.distributed import DistributedConfig

# ssh without a terminal, so the end of stdin reaches the rank (its lifeline), and failing fast
# rather than asking for a password nobody will type.
SSH_OPTIONS = ("-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")


def ring_hostfile(dist: DistributedConfig) -> str:
    """``MLX_HOSTFILE``'s content for the ring: ``[["ip:port"], ...]``, rank r on port + r."""
    return json.dumps([[f"{address}:{port}"] for address, port in dist.ring_ports()])


def jaccl_devices(dist: DistributedConfig) -> str:
    """``MLX_IBV_DEVICES``'s content: each host's RDMA device towards each rank (null for itself)."""
    return json.dumps([list(h.rdma or ()) for h in dist.hosts])


def rank_files(dist: DistributedConfig) -> dict[str, str]:
    """The files each rank's environment names, by variable: what to write, the same for every rank."""
    if dist.resolved_backend() == "jaccl":
        return {"MLX_IBV_DEVICES": jaccl_devices(dist)}
    return {"MLX_HOSTFILE": ring_hostfile(dist)}


def rank_env(dist: DistributedConfig, rank: int, paths: dict[str, str]) -> dict[str, str]:
    """Rank ``rank``'s MLX variables, the files' ``paths`` (by variable) already written."""
    env = {"MLX_RANK": str(rank), **paths}
    if dist.resolved_backend() == "jaccl":
        env["MLX_JACCL_COORDINATOR"] = f"{dist.hosts[0].address}:{dist.port}"
    return env


def follower_argv(python: str, name: str, log_level: str, state_dir: str | None = None) -> list[str]:
    """The program of a rank other than 0 (its config comes on stdin)."""
    argv = [python, "-m", "vllmmlxd.worker.follower", "--name", name, "--log-level", log_level]
    return argv + (["--state-dir", state_dir] if state_dir else [])


def remote_script(argv: list[str], env: dict[str, str], files: dict[str, str]) -> str:
    """The shell script a remote rank runs (as ``mlx.launch``'s per-rank script): each file written to
    a private temporary file its variable names, the environment exported, then the rank exec'd."""
    lines = ["set -e", "umask 077"]
    for var, content in files.items():
        lines.append(f'{var}="$(mktemp)"')
        lines.append(f'printf %s {shlex.quote(content)} > "${var}"')
        lines.append(f"export {var}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items() if k not in files]
    lines.append("exec " + shlex.join(argv))
    return "; ".join(lines)


def ssh_argv(ssh: str, host: str, script: str) -> list[str]:
    """The local command that runs ``script`` on ``host`` (after ``--``: ssh reads no option from
    it, whatever the config checked)."""
    return [*shlex.split(ssh), *SSH_OPTIONS, "--", host, script]
