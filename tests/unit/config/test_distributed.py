"""``distributed:``: what a sharded entry may say, and each thing refused before a rank starts."""

from __future__ import annotations

import json
import textwrap

import pytest
from pydantic import ValidationError

from vllmmlxd.config import distributed as dist_mod
from vllmmlxd.config.distributed import BUILTIN_SHAPES, DistributedConfig
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import Config
from vllmmlxd.errors import ConfigError
from vllmmlxd.runtime.shard_families import folder_shape

LOCAL2 = ["127.0.0.1", "127.0.0.1"]


def entry(**fields) -> dict:
    return {"model": "builtin:smollm2-135m-instruct", "port": 8101, **fields}


def config(models: dict, **top) -> Config:
    return Config.model_validate({"models": models, **top})


def test_two_local_ranks_by_pipeline_is_the_default_split():
    got = config({"s": entry(distributed={"hosts": LOCAL2})}).models["s"].distributed
    assert got is not None and got.parallel == "pipeline" and got.world == 2
    assert got.resolved_backend() == "ring"  # auto, without RDMA devices
    assert got.ring_ports() == [("127.0.0.1", 32323), ("127.0.0.1", 32324)]
    assert all(h.local for h in got.hosts)


def test_a_remote_host_with_its_address_python_and_memory():
    got = DistributedConfig.model_validate(
        {
            "hosts": [
                {"host": "127.0.0.1", "ip": "10.0.5.1"},
                {"host": "studio-2.local", "ip": "10.0.5.2", "python": "/opt/v/bin/python"},
            ]
        }
    )
    assert not got.hosts[1].local and got.hosts[1].address == "10.0.5.2"
    assert got.ring_ports()[1] == ("10.0.5.2", 32324)


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"distributed": {"hosts": ["127.0.0.1"]}}, "at least 2 hosts"),
        # ssh would read it as an option (issue 37); no host name has a space or a quote either.
        ({"distributed": {"hosts": ["127.0.0.1", "-oProxyCommand=touch /tmp/x"]}}, "not a host name"),
        ({"distributed": {"hosts": ["127.0.0.1", "studio 2"]}}, "not a host name"),
        ({"distributed": {"hosts": ["studio-2.local", "127.0.0.1"]}}, "rank 0 .* runs here: put 127.0.0.1"),
        ({"distributed": {"hosts": LOCAL2, "backend": "nccl"}}, "'ring', 'jaccl' or 'auto'"),
        ({"distributed": {"hosts": LOCAL2, "backend": "jaccl"}}, "jaccl needs each host's RDMA devices"),
        ({"distributed": {"hosts": LOCAL2, "parallel": "expert"}}, "'pipeline' or 'tensor'"),
        (
            {"distributed": {"hosts": [{"host": "127.0.0.1", "ip": "10.0.0.1"}, {"host": "h", "ip": "fd00::2"}]}},
            "ring needs an IPv4",
        ),
        (
            {"distributed": {"hosts": ["127.0.0.1", {"host": "studio-2.local", "ip": "10.0.5.2"}]}},
            "hosts\\[0\\]: with ranks on other hosts, give the address they reach 127.0.0.1 at",
        ),
        ({"distributed": {"hosts": LOCAL2}, "load": "lazy"}, "lazy is not supported for a distributed entry"),
        (
            {"model": "builtin:all-minilm-l6-v2", "distributed": {"hosts": LOCAL2}},
            "cannot be split over ranks \\(an embedding model\\)",
        ),
        (
            {"model": "builtin:tiny", "distributed": {"hosts": [*LOCAL2, "127.0.0.1"]}},
            "at least as many layers \\(2\\) as ranks",
        ),
        (
            {"distributed": {"hosts": LOCAL2 * 2, "parallel": "tensor"}},
            "at least one key/value head per rank \\(3 key/value heads\\)",
        ),
        (
            {
                "model": "/m/x.gguf",
                "distributed": {"hosts": [{"host": "127.0.0.1", "ip": "10.0.0.1"}, "studio-2.local"]},
            },
            "a .gguf is converted on this host only",
        ),
    ],
)
def test_entries_that_cannot_be_split_are_refused_saying_why(fields, error):
    with pytest.raises(ValidationError, match=error):
        config({"s": entry(**fields)})


def test_jaccl_is_refused_off_macos_with_what_to_use(monkeypatch):
    monkeypatch.setattr(dist_mod.sys, "platform", "linux")
    hosts = [
        {"host": "127.0.0.1", "ip": "10.0.0.1", "rdma": [None, "rdma_en3"]},
        {"host": "h2", "ip": "10.0.0.2", "rdma": ["rdma_en3", None]},
    ]
    with pytest.raises(ValidationError, match=r"jaccl needs macOS 26.2\+ .* use backend: ring"):
        DistributedConfig.model_validate({"hosts": hosts, "backend": "jaccl"})
    assert DistributedConfig.model_validate({"hosts": hosts}).resolved_backend() == "ring"  # auto, off macOS


def test_a_local_folder_is_checked_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "gemma3", "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4}
        )
    )
    with pytest.raises(ValidationError, match="cannot split a gemma3 model by pipeline"):
        config({"s": entry(model=str(tmp_path), distributed={"hosts": LOCAL2})})
    # A hub id is checked by the ranks when they load (nothing to read here).
    config({"s": entry(model="mlx-community/Qwen2.5-72B-Instruct-4bit", distributed={"hosts": LOCAL2})})


def test_ring_ports_may_not_meet_another_listener():
    with pytest.raises(ValidationError, match=r"'b' rank 0 listens on 127.0.0.1:32324, where 'a' does too"):
        config(
            {
                "a": entry(distributed={"hosts": LOCAL2}),
                "b": entry(port=8102, distributed={"hosts": LOCAL2, "port": 32324}),
            }
        )
    with pytest.raises(ValidationError, match=r"rank 0 listens on 127.0.0.1:32323, where 'web' does too"):
        config({"web": entry(port=32323), "s": entry(distributed={"hosts": LOCAL2})})
    config(
        {"a": entry(distributed={"hosts": LOCAL2}), "b": entry(port=8102, distributed={"hosts": LOCAL2, "port": 32400})}
    )


def test_an_upstream_entry_cannot_be_distributed():
    with pytest.raises(ValidationError, match="distributed is for a model served here"):
        config({"u": {"upstream": "http://h:1", "distributed": {"hosts": LOCAL2}}})


def test_the_error_points_at_the_line_in_the_file():
    text = textwrap.dedent(
        """\
        models:
          s:
            model: builtin:smollm2-135m-instruct
            distributed:
              hosts: [127.0.0.1]
        """
    )
    with pytest.raises(ConfigError, match=r"<string>:5:\d+: models\.s\.distributed\.hosts: .*at least 2 hosts"):
        parse_config(text)


@pytest.mark.parametrize("name", sorted(BUILTIN_SHAPES))
def test_the_builtin_shapes_are_the_built_models(name, tmp_path):
    # Built (or found in the suite's shared state dir, as every test that loads them does).
    from vllmmlxd.engine.loading.builtin import ensure_builtin
    from vllmmlxd.paths import resolve_state_dir

    assert folder_shape(ensure_builtin(name, resolve_state_dir(None))) == BUILTIN_SHAPES[name]
