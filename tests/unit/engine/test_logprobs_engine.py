"""Log-probabilities from the batch on builtin:tiny (float32) against mlx-lm's own forward pass
over the same tokens: each written token's and the top 5, alone, batched beside requests that
ask for none, with prompt-lookup speculation on, and with a penalty (raw: the model's own
distribution, before processors and temperature)."""

from __future__ import annotations

import asyncio
from typing import cast

import mlx.core as mx
import pytest

from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.speculation.speculative import SpeculationOptions
from vllmmlxd.engine.step.logprobs import TokenLogprob
from vllmmlxd.engine.types import Finished, GenerationRequest, Logprobs, SamplingParams

CODE = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n" * 3
ASKS = [CODE + "def add(a, b):", "Once upon a time there was", "1, 2, 3, 4, 5, 6"]
TOP = 5


@pytest.fixture(scope="module")
def tiny(state_dir):
    from vllmmlxd.engine.loading.loader import load_model

    return load_model("builtin:tiny", state_dir)


def run(eng: MLXEngine, asks: list[str], asking: list[bool], **sampling) -> list[tuple[list[int], list[TokenLogprob]]]:
    async def one(text: str, ask: bool) -> tuple[list[int], list[TokenLogprob]]:
        ids = eng.tokenize(text)
        params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=TOP if ask else None, **sampling)
        entries: list[TokenLogprob] = []
        async for event in eng.generate(GenerationRequest(ids, params)):
            if isinstance(event, Logprobs):
                entries += event.entries
            assert not isinstance(event, Finished) or event.reason in ("length", "stop")
        return ids, entries

    async def all_of() -> list:
        return await asyncio.gather(*(one(t, a) for t, a in zip(asks, asking, strict=True)))

    return asyncio.run(all_of())


def reference(model, prompt: list[int], written: list[int]) -> mx.array:
    """mlx-lm's forward over prompt + written: row p is the log-softmax that chose written[p]."""
    logits = model(mx.array([prompt + written]))[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return logprobs[len(prompt) - 1 : len(prompt) - 1 + len(written)]


def check(model, prompt: list[int], entries: list[TokenLogprob]) -> None:
    assert entries, "no log-probabilities came back"
    written = [e.token for e in entries]
    want = reference(model, prompt, written)
    for p, entry in enumerate(entries):
        row = want[p]
        assert entry.logprob is not None and entry.top is not None  # a written token has both
        assert abs(entry.logprob - cast(float, row[entry.token].item())) < 1e-4
        best = cast(list[float], mx.sort(row)[::-1][:TOP].tolist())
        # Ties at the edge of the top 5 could order either way; the values must match in order.
        assert [c.logprob for c in entry.top] == pytest.approx(best, abs=1e-4)
        assert all(abs(c.logprob - cast(float, row[c.token].item())) < 1e-4 for c in entry.top)
        assert entry.top[0].token == entry.token  # greedy: the written token is the most likely


@pytest.mark.parametrize("spec", [None, SpeculationOptions(num_draft=3, adaptive=False)], ids=["plain", "speculating"])
def test_logprobs_equal_mlx_lms_forward_alone_and_batched(tiny, spec):
    eng = MLXEngine(tiny, options=EngineOptions(speculative=spec))
    try:
        alone = run(eng, ASKS[:1], [True])
        batched = run(eng, ASKS, [True, False, True])
    finally:
        eng.close()
    for prompt, entries in [*alone, batched[0], batched[2]]:
        check(tiny.model, prompt, entries)
    assert batched[1][1] == []  # a row that did not ask gets none
    assert [e.token for e in alone[0][1]] == [e.token for e in batched[0][1]]


def test_logprobs_are_the_models_raw_distribution_under_a_penalty(tiny):
    eng = MLXEngine(tiny, options=EngineOptions())
    try:
        [(prompt, entries)] = run(eng, ASKS[1:2], [True], repetition_penalty=1.3)
    finally:
        eng.close()
    want = reference(tiny.model, prompt, [e.token for e in entries])
    assert all(abs((e.logprob or 0) - cast(float, want[p][e.token].item())) < 1e-4 for p, e in enumerate(entries))
