"""rank_launch.py: MLX's launcher contract as vllmmlxd restates it (hostfile, env, argv, remote script, ssh)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from vllmmlxd.config import distributed as dist_mod
from vllmmlxd.config.distributed import DistributedConfig
from vllmmlxd.supervisor.slot import rank_launch


def ring(*hosts, **fields) -> DistributedConfig:
    return DistributedConfig.model_validate({"hosts": list(hosts), "backend": "ring", **fields})


def test_the_ring_hostfile_for_two_loopback_ranks_is_mlx_launchs():
    """``127.0.0.1`` twice on port 32323: rank r on port + r, one list per rank."""
    dist = ring("127.0.0.1", "127.0.0.1", port=32323)
    assert json.loads(rank_launch.ring_hostfile(dist)) == [["127.0.0.1:32323"], ["127.0.0.1:32324"]]
    assert rank_launch.rank_files(dist) == {"MLX_HOSTFILE": rank_launch.ring_hostfile(dist)}


def test_a_remote_hosts_ip_is_its_address_in_the_hostfile():
    """A remote rank is reached at its ``ip``, not at its ssh name."""
    dist = ring(
        {"host": "127.0.0.1", "ip": "10.0.5.1"},
        {"host": "studio-2.local", "ip": "10.0.5.2"},
        {"host": "localhost", "ip": "10.0.5.1"},
        port=40000,
    )
    assert json.loads(rank_launch.ring_hostfile(dist)) == [
        ["10.0.5.1:40000"],
        ["10.0.5.2:40001"],
        ["10.0.5.1:40002"],
    ]


def test_ring_env_is_the_rank_and_the_hostfiles_path():
    dist = ring("127.0.0.1", "127.0.0.1")
    assert rank_launch.rank_env(dist, 1, {"MLX_HOSTFILE": "/run/h.json"}) == {
        "MLX_RANK": "1",
        "MLX_HOSTFILE": "/run/h.json",
    }
    assert rank_launch.rank_env(dist, 0, {}) == {"MLX_RANK": "0"}  # a remote rank: its script writes the file


def test_jaccl_env_names_the_devices_file_and_rank_0_as_coordinator(monkeypatch):
    """jaccl: MLX_IBV_DEVICES (each host's RDMA devices) and MLX_JACCL_COORDINATOR = rank 0's ip:port."""
    monkeypatch.setattr(dist_mod.sys, "platform", "darwin")
    monkeypatch.setattr(dist_mod, "_macos_version", lambda: (26, 2))
    dist = DistributedConfig.model_validate(
        {
            "hosts": [
                {"host": "127.0.0.1", "ip": "10.0.5.1", "rdma": [None, "rdma_en3"]},
                {"host": "studio-2.local", "ip": "10.0.5.2", "rdma": ["rdma_en4", None]},
            ],
            "port": 40100,
        }
    )
    assert dist.resolved_backend() == "jaccl"  # auto, with every host's devices on macOS 26.2
    files = rank_launch.rank_files(dist)
    assert list(files) == ["MLX_IBV_DEVICES"]
    assert json.loads(files["MLX_IBV_DEVICES"]) == [[None, "rdma_en3"], ["rdma_en4", None]]
    assert rank_launch.rank_env(dist, 1, {"MLX_IBV_DEVICES": "/run/d.json"}) == {
        "MLX_RANK": "1",
        "MLX_IBV_DEVICES": "/run/d.json",
        "MLX_JACCL_COORDINATOR": "10.0.5.1:40100",
    }


def test_the_follower_argv_runs_the_follower_module():
    assert rank_launch.follower_argv("/v/python", "big", "debug") == [
        "/v/python",
        "-m",
        "vllmmlxd.worker.follower",
        "--name",
        "big",
        "--log-level",
        "debug",
    ]
    assert rank_launch.follower_argv("/v/python", "big", "info", "/var/v")[-2:] == ["--state-dir", "/var/v"]


# What the remote rank's program is replaced by: it prints its argv, its MLX variables, the
# hostfile's content and mode, and the umask it runs under.
REPORT = (
    "import json, os, stat, sys\n"
    "path = os.environ['MLX_HOSTFILE']\n"
    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() if k.startswith(('MLX_', 'ODD'))},"
    " 'content': open(path).read(), 'mode': stat.S_IMODE(os.stat(path).st_mode)}))\n"
)


def test_the_remote_script_delivers_files_env_and_argv_intact(tmp_path):
    """Quotes, ``$``, backticks, spaces and newlines arrive as they were sent; the file is 0600."""
    content = '[["10.0.0.1:1"]]\n it\'s $HOME and `id` \\ "q"\n\n%s end  '
    env = {"MLX_RANK": "1", "ODD_VALUE": "a 'b' \"c\" $PATH\nline 2"}
    argv = [sys.executable, "-c", REPORT, "two words", "$HOME", "it's", ""]
    script = rank_launch.remote_script(argv, env, {"MLX_HOSTFILE": content})
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    out = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**clean, "TMPDIR": str(tmp_path)},
    )
    got = json.loads(out.stdout)
    assert got["argv"] == ["two words", "$HOME", "it's", ""]
    assert got["content"] == content
    assert got["mode"] == 0o600
    assert got["env"]["MLX_RANK"] == "1" and got["env"]["ODD_VALUE"] == env["ODD_VALUE"]
    assert got["env"]["MLX_HOSTFILE"].startswith(str(tmp_path))  # a mktemp file
    assert stat.S_IMODE(os.stat(got["env"]["MLX_HOSTFILE"]).st_mode) == 0o600


def test_ssh_argv_splits_the_setting_and_runs_without_a_terminal():
    """``ssh: "/path/fake-ssh -p 2222"``: its words, then -T and BatchMode=yes, the host, the script."""
    argv = rank_launch.ssh_argv("/path/fake-ssh -p 2222", "studio-2.local", "set -e; exec x")
    assert argv[:3] == ["/path/fake-ssh", "-p", "2222"]
    assert argv[-3:] == ["--", "studio-2.local", "set -e; exec x"]  # no host is ever read as an option
    options = argv[3:-3]
    assert "-T" in options and "-tt" not in options
    assert options[options.index("BatchMode=yes") - 1] == "-o"
    assert rank_launch.ssh_argv("ssh", "h", "s")[0] == "ssh"
