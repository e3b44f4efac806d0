"""Rows whose KV lives in groups: the forward pass over groups gives each row the logits it gets
alone, joining copies no one's KV, a finished row's group is dropped, and a batch past
MAX_GROUPS merges neighbours; on random-weight llama and qwen3 layers (equality of two paths)."""

from __future__ import annotations

import importlib

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchKVCache

from vllmmlxd.engine.batch.row_groups import (
    MAX_GROUPS,
    GroupedBatch,
    GroupedKV,
    GroupedModel,
    Segment,
    groupable,
)


def small_model(family: str):
    module = importlib.import_module(f"mlx_lm.models.{family}")
    fields = dict(
        model_type=family,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=50,
        rope_theta=10000.0,
        tie_word_embeddings=family == "qwen3",
    )
    if family == "qwen3":
        fields |= {"head_dim": 8, "max_position_embeddings": 512, "rope_scaling": None}
    mx.random.seed(3)
    model = module.Model(module.ModelArgs(**fields))
    mx.eval(model.parameters())
    return model


def prefilled(model, prompts: list[list[int]]) -> list[BatchKVCache]:
    """One BatchKVCache a layer holding ``prompts`` left-padded, as mlx-lm batches them."""
    longest = max(map(len, prompts))
    pads = [longest - len(p) for p in prompts]
    cache = [BatchKVCache(pads) for _ in model.layers]
    model(mx.array([[0] * pad + p for pad, p in zip(pads, prompts)]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def alone(model, prompt: list[int], token: int) -> np.ndarray:
    cache = prefilled(model, [prompt])
    return np.array(model(mx.array([[token]]), cache=cache)[0, -1])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_step_over_groups_gives_each_row_its_own_logits(family):
    model = small_model(family)
    assert groupable(model)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    first, second = prefilled(model, prompts[:2]), prefilled(model, prompts[2:])
    cache = [GroupedKV([a, b]) for a, b in zip(first, second)]
    logits = GroupedModel(model)(mx.array([[20], [21], [22]]), cache=cache)
    for row, (prompt, token) in enumerate(zip(prompts, [20, 21, 22])):
        np.testing.assert_allclose(np.array(logits[row, -1]), alone(model, prompt, token), atol=1e-4)
    # A second step reads what the first wrote, group by group.
    again = GroupedModel(model)(mx.array([[23], [24], [25]]), cache=cache)
    for row, (prompt, token) in enumerate(zip(prompts, [20, 21, 22])):
        cache_alone = prefilled(model, [[*prompt, token]])
        want = np.array(model(mx.array([[23 + row]]), cache=cache_alone)[0, -1])
        np.testing.assert_allclose(np.array(again[row, -1]), want, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_prompt_chunk_riding_on_a_step_is_prefilled_as_it_is_alone(family):
    model = small_model(family)
    running = prefilled(model, [[1, 2, 3], [4, 5, 6, 7, 8]])
    prompt = [9, 10, 11, 12, 13, 14]
    riding, solo = prefilled(model, [prompt[:2]]), prefilled(model, [prompt[:2]])
    grouped = GroupedModel(model)
    grouped.rider = Segment(mx.array([prompt[2:]]), riding)
    logits = grouped(mx.array([[20], [21]]), cache=running)
    assert grouped.rider is None  # taken by the pass
    np.testing.assert_allclose(np.array(logits[0, -1]), alone(model, [1, 2, 3], 20), atol=1e-4)
    np.testing.assert_allclose(np.array(logits[1, -1]), alone(model, [4, 5, 6, 7, 8], 21), atol=1e-4)
    model(mx.array([prompt[2:]]), cache=solo)
    for a, b in zip(riding, solo):
        np.testing.assert_allclose(np.array(a.keys[..., : a._idx, :]), np.array(b.keys[..., : b._idx, :]), atol=1e-4)
        np.testing.assert_allclose(
            np.array(a.values[..., : a._idx, :]), np.array(b.values[..., : b._idx, :]), atol=1e-4
        )
    assert logits.shape[:2] == (2, 1)


def test_a_group_none_of_whose_rows_stay_is_dropped_without_touching_the_rest():
    model = small_model("llama")
    a, b, c = (prefilled(model, p)[0] for p in ([[1, 2], [3, 4, 5]], [[6] * 9], [[7, 8]]))
    grouped = GroupedKV([a, b, c])
    keys_b = b.keys
    grouped.filter([0, 1, 3])  # row 2 (group b, alone) finished
    assert grouped.groups == [a, c] and b.keys is keys_b
    grouped.filter([1, 2])  # row 0 of group a finished: a filters itself, c stays as it is
    assert len(grouped.groups) == 2 and grouped.groups[1] is c and int(grouped.groups[0].offset.shape[0]) == 1


def test_a_row_alone_in_its_group_is_extracted_as_a_view_of_its_own_kv():
    model = small_model("llama")
    running, joined = prefilled(model, [[1, 2, 3]]), prefilled(model, [[4, 5, 6, 7, 8]])
    grouped = GroupedKV([running[0], joined[0]])
    row = grouped.extract(1)
    assert row.offset == 5
    np.testing.assert_array_equal(np.array(row.keys), np.array(joined[0].keys[..., :5, :]))


def test_past_max_groups_the_cheapest_neighbours_merge_and_rows_keep_their_order():
    from mlx_lm.generate import StopSequences

    model = small_model("llama")
    greedy = lambda x: mx.argmax(x, axis=-1)  # noqa: E731
    lengths = [40, 3, 4, 30, 5, 6]  # the short neighbours (3, 4) are cheapest to merge
    batch = GroupedBatch.empty(GroupedModel(model), greedy)
    batch.grouping = True
    for n in lengths:
        prompt = list(range(1, n + 1))
        batch.extend(
            GenerationBatch(
                GroupedModel(model), [n], mx.array([1], dtype=mx.uint32), prefilled(model, [prompt]),
                [prompt], [greedy], greedy, [()], [StopSequences()], [100],
            )
        )  # fmt: skip
    groups = batch.prompt_cache[0].groups
    assert len(groups) == MAX_GROUPS
    assert [int(g.offset.shape[0]) for g in groups] == [1, 2, 1, 2]  # (3, 4), then (5, 6) merged
    assert batch.uids == lengths
    assert all(len(c.groups) == MAX_GROUPS for c in batch.prompt_cache)  # every layer alike
