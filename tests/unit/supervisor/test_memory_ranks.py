"""Memory admission of a distributed entry: each rank's share counted on its own host."""

from __future__ import annotations

from vllmmlxd.config.distributed import DistributedConfig
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.supervisor.memory import (
    Capacity,
    Footprint,
    RemoteRank,
    local_footprint,
    plan_memory,
    rank_footprints,
    rank_weights,
)

PIPE2 = DistributedConfig.model_validate({"hosts": ["127.0.0.1", "127.0.0.1"]})
TENSOR2 = DistributedConfig.model_validate({"hosts": ["127.0.0.1", "127.0.0.1"], "parallel": "tensor"})
# 100 bytes outside the layers (embeddings: every rank keeps them), 4 layers of 10, 20, 30, 40 bytes.
SPLIT = (100, {0: 10, 1: 20, 2: 30, 3: 40})


def test_a_pipeline_rank_holds_what_is_outside_the_layers_and_its_own_layers():
    # Rank 0 runs the last layers (2, 3), rank 1 the first (0, 1); scaled to the loaded size (x2).
    assert rank_weights(400, SPLIT, PIPE2, 0, None) == 2 * (100 + 30 + 40)
    assert rank_weights(400, SPLIT, PIPE2, 1, None) == 2 * (100 + 10 + 20)


def test_a_tensor_rank_holds_the_outside_and_its_part_of_every_layer():
    assert rank_weights(200, SPLIT, TENSOR2, 0, None) == 100 + 50


def test_without_headers_the_layer_count_splits_the_weights():
    assert rank_weights(300, None, PIPE2, 0, 30) == 150
    assert rank_weights(300, None, TENSOR2, 1, None) == 150


def test_two_local_ranks_count_twice_the_overhead_and_cache_here():
    entry = ModelConfig(model="builtin:smollm2-135m-instruct", distributed=PIPE2, cache_memory_mb=64)
    whole = Footprint(weights_mb=514, cache_mb=64, weights_note="smollm2", cache_note="cache_memory_mb")
    ranks = rank_footprints(entry, whole, (56, {i: 7 for i in range(30)}), 30)
    here = local_footprint(ranks, entry)
    assert here.worker_mb == 400 and here.cache_mb == 128
    assert here.weights_mb == ranks[0].weights_mb + ranks[1].weights_mb > whole.weights_mb  # embeddings twice
    assert "rank 0, layers 15-29 of 30" in ranks[0].weights_note


def test_a_remote_rank_that_does_not_fit_its_host_is_refused_with_the_numbers():
    far = RemoteRank("llama70", 1, "studio-2.local", Footprint(20480, 824), 16384)
    plan = plan_memory(Capacity(65536, 2048), {"llama70": Footprint(20480, 824)}, remote=(far,))
    assert not plan.fits
    text = plan.refusal()
    assert (
        "not enough memory on studio-2.local: llama70 rank 1 on studio-2.local: 21,504 MB = 20,480 MB weights" in text
    )
    assert "16,384 MB given (memory_mb): does not fit" in text and "split the model over more hosts" in text
    assert "the models need" not in text  # this host has room: only the far one is named
    unknown = RemoteRank("llama70", 1, "studio-2.local", Footprint(20480, 824), None)
    fine = plan_memory(Capacity(65536, 2048), {"llama70": Footprint(20480, 824)}, remote=(unknown,))
    assert fine.fits and "not checked: give the host's memory_mb" in fine.render()
