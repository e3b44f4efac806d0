"""units.rank_fields: a distributed entry's split and ranks for status, from its config when nothing runs."""

from __future__ import annotations

import pytest

from vllmmlxd.config.entries import ResolvedModel
from vllmmlxd.supervisor.units import rank_fields
from vllmmlxd.supervisor.views import RankView

SMOLLM2 = "builtin:smollm2-135m-instruct"


def entry(parallel: str, hosts: list | None = None) -> ResolvedModel:
    hosts = hosts or [{"host": "127.0.0.1", "ip": "10.0.5.1"}, {"host": "studio-2.local", "ip": "10.0.5.2"}]
    return ResolvedModel.model_validate(
        {"model": SMOLLM2, "port": 8101, "distributed": {"hosts": hosts, "backend": "ring", "parallel": parallel}}
    )


@pytest.mark.parametrize(
    "parallel, shares",
    [("pipeline", ["layers 15-29 of 30", "layers 0-14 of 30"]), ("tensor", ["heads 6 of 9", "heads 3 of 9"])],
)
def test_with_no_worker_each_rank_is_stopped_with_its_share_from_the_config(parallel, shares):
    """No worker: every rank ``stopped`` without a pid; its share is what the config gives it (smollm2:
    30 layers, rank 0 holding the last ones as in mlx-lm; 9 heads in 3 key/value groups, so tensor
    by 2 gives rank 0 two groups and rank 1 one)."""
    got = rank_fields(entry(parallel), None, "stopped")
    assert got["distributed"] == {"backend": "ring", "parallel": parallel, "world": 2}
    assert got["ranks"] == [
        RankView(rank=0, host="127.0.0.1", pid=None, state="stopped", share=shares[0]),
        RankView(rank=1, host="studio-2.local", pid=None, state="stopped", share=shares[1]),
    ]


def test_three_ranks_by_pipeline_split_the_layers_from_the_last():
    """Rank 0 runs the last layers, rank 2 the first."""
    got = rank_fields(entry("pipeline", ["127.0.0.1"] * 3), None, "stopped")
    assert [r.share for r in got["ranks"]] == ["layers 20-29 of 30", "layers 10-19 of 30", "layers 0-9 of 30"]


def test_a_single_process_entry_has_no_rank_fields():
    assert rank_fields(ResolvedModel.model_validate({"model": SMOLLM2, "port": 8101}), None, "ready") == {}
