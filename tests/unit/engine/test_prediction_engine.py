"""Predicted outputs on builtin:tiny: a request's prediction drafts its answer inside the batch,
and the answer is the one it gets without (greedy and seeded), whether the prediction is its own
answer (drafts kept in long runs), an edit of it (back on the prediction after the difference),
or wrong; the usage counts the prediction's tokens drafted and kept."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.speculation.speculative import SpeculationOptions, predicted_drafts
from vllmmlxd.engine.types import Finished, GenerationRequest, SamplingParams

PROMPT = "Once upon a time there was"


@pytest.fixture(scope="module")
def engine(state_dir):
    from vllmmlxd.engine.loading.loader import load_model

    eng = MLXEngine(
        load_model("builtin:tiny", state_dir),
        options=EngineOptions(speculative=SpeculationOptions(num_draft=3, adaptive=False)),
    )
    yield eng
    eng.close()


def answer(eng: MLXEngine, prediction: list[int] | None, **sampling) -> tuple[list[int], Finished]:
    async def run() -> tuple[list[int], Finished]:
        params = SamplingParams(max_tokens=40, **{"temperature": 0.0, "logprobs": 0, **sampling})
        request = GenerationRequest(eng.tokenize(PROMPT), params, prediction=tuple(prediction) if prediction else None)
        tokens, last = [], None
        async for event in eng.generate(request):
            tokens += [e.token for e in getattr(event, "entries", ())]
            last = event if isinstance(event, Finished) else last
        assert last is not None
        return tokens, last

    return asyncio.run(run())


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 5}], ids=["greedy", "seeded"])
def test_a_prediction_drafts_the_answer_and_changes_nothing_in_it(engine, sampling):
    plain, alone = answer(engine, None, speculative=False, **sampling)
    own, same = answer(engine, plain, **sampling)
    assert own == plain and same.usage.accepted_predicted >= len(plain) // 2  # kept in long runs
    edited = [*plain[:10], *(t + 1 for t in plain[10:13]), *plain[13:]]
    back, after_edit = answer(engine, edited, **sampling)
    assert back == plain and after_edit.usage.accepted_predicted > 10  # back on it past the edit
    wrong, missed = answer(engine, [7] * 40, **sampling)
    assert wrong == plain and missed.usage.predicted_tokens >= missed.usage.accepted_predicted
    assert alone.usage.predicted_tokens == 0  # no prediction: nothing counted


def test_predicted_drafts_follow_the_output_on_the_prediction_and_find_it_again():
    pred = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9], np.int64)
    assert predicted_drafts(pred, np.array([], np.int64), 4, 3) == [1, 2, 3]
    assert predicted_drafts(pred, np.array([1, 2], np.int64), 4, 3) == [3, 4, 5]
    assert predicted_drafts(pred, np.array([1, 2, 9, 9, 4, 5], np.int64), 4, 3) == [6, 7, 8]  # after an edit
    assert predicted_drafts(pred, np.array([9, 9, 9], np.int64), 4, 3) == []
