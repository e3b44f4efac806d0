"""Speculation on builtin:tiny in the test's process: greedy answers are the same token for token
with and without it (prompt lookup and a draft model, in a batch of speculating and plain
requests), a draft model of the target itself accepts everything, a seeded sampled answer
repeats, and a grammar holds while drafts are verified."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.speculation.speculative import SpeculationOptions
from vllmmlxd.engine.types import Constraint, Finished, GenerationRequest, SamplingParams, TextDelta
from vllmmlxd.parsers.grammar import json_grammar

CODE = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n" * 3
# Raw prompts: the random model repeats a token, then turns to another (drafts land, then one is
# rejected), where after a chat template it only writes newlines.
ASKS = [CODE + "def add(a, b):", "Once upon a time there was", "1, 2, 3, 4, 5, 6", "The quick brown fox"]


@pytest.fixture(scope="module")
def tiny(state_dir):
    from vllmmlxd.engine.loading.loader import load_model

    return load_model("builtin:tiny", state_dir)


def engine(tiny, spec: SpeculationOptions | None, draft=None) -> MLXEngine:
    # Not adaptive: every request drafts every step, whatever this machine's measured costs say
    # (they decide the width, which must not decide what these tests see).
    spec = replace(spec, adaptive=False) if spec is not None else None
    return MLXEngine(tiny, options=EngineOptions(speculative=spec), draft=draft)


def answers(eng: MLXEngine, asks: list[str], max_tokens: int = 48, **sampling) -> list[tuple[str, Finished]]:
    async def one(text: str, opt: dict) -> tuple[str, Finished]:
        ids = eng.tokenize(text)
        params = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling, **opt})
        out, last = "", None
        async for event in eng.generate(GenerationRequest(ids, params)):
            out += event.text if isinstance(event, TextDelta) else ""
            last = event if isinstance(event, Finished) else last
        assert last is not None
        return out, last

    async def all_of() -> list:
        # Every other request opts out: speculating and plain rows share the batch.
        return await asyncio.gather(*(one(t, {"speculative": i % 2 == 0}) for i, t in enumerate(asks)))

    return asyncio.run(all_of())


@pytest.fixture(scope="module")
def plain(tiny):
    eng = engine(tiny, None)
    texts = [text for text, _ in answers(eng, ASKS)]
    eng.close()
    assert len(set(texts)) == len(ASKS)  # four different answers
    return texts


@pytest.mark.parametrize("method", ["prompt-lookup", "draft"])
def test_greedy_answers_are_the_same_with_speculation(tiny, plain, method):
    eng = engine(tiny, SpeculationOptions(method=method, num_draft=4), draft=tiny if method == "draft" else None)
    try:
        assert [text for text, _ in answers(eng, ASKS)] == plain
        stats = eng._scheduler.spec.stats
        assert stats.drafted > 0 and stats.accepted > 0
        if method == "draft":  # the target drafting for itself: its greedy drafts are its own answer
            assert stats.accepted == stats.drafted
    finally:
        eng.close()


def test_a_kv_budget_counts_the_draft_models_cache_and_positions_and_keeps_the_answers(tiny, plain):
    # builtin:tiny drafting for itself: each row holds the target's KV and the draft's (512 bytes
    # a token each), and a verify step writes num_draft positions before it trims them.
    longest = max(len(tiny.tokenizer.encode(t)) for t in ASKS) + 48 + 256 + 4
    budget = 2 * longest * 1024  # two rows at a time
    spec = SpeculationOptions(method="draft", num_draft=4, adaptive=False)
    eng = MLXEngine(tiny, options=EngineOptions(speculative=spec, kv_budget_bytes=budget), draft=tiny)
    try:
        assert eng.kv_status()["bytes_per_token"] == 1024 and eng._scheduler.kv.slack == 256 + 4
        assert [text for text, _ in answers(eng, ASKS)] == plain  # queued two by two, the same text
        assert eng.stats.kv_peak_held_bytes <= budget
    finally:
        eng.close()


def test_a_seeded_sampled_answer_repeats_under_speculation(tiny):
    for spec, draft in ((SpeculationOptions(), None), (SpeculationOptions(method="draft"), tiny)):
        eng = engine(tiny, spec, draft)
        try:
            first = answers(eng, ASKS[:2], max_tokens=24, temperature=0.9, seed=11)
            again = answers(eng, ASKS[:2], max_tokens=24, temperature=0.9, seed=11)
            assert [t for t, _ in first] == [t for t, _ in again]
        finally:
            eng.close()


def test_a_grammar_holds_while_drafts_are_verified(tiny):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "maximum": 99}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    grammar = Constraint(json_grammar(schema))  # as structured output makes it: no free whitespace
    EXAMPLES = '{"name": "ab", "n": 12}\n{"name": "cd", "n": 34}\n'  # what prompt lookup drafts from

    def constrained(eng: MLXEngine) -> str:
        async def run() -> str:
            ids = eng.tokenize(CODE + EXAMPLES + "{")
            request = GenerationRequest(ids, SamplingParams(max_tokens=80, temperature=0.0), constraint=grammar)
            out = ""
            async for event in eng.generate(request):
                out += event.text if isinstance(event, TextDelta) else ""
            return out

        return asyncio.run(run())

    plain, spec = engine(tiny, None), engine(tiny, SpeculationOptions())
    try:
        assert spec.check_constraint(grammar) is None
        answer = constrained(spec)
        assert answer == constrained(plain)
        value = json.loads(answer)
        assert set(value) == {"name", "n"} and len(value["name"]) <= 12
        assert spec._scheduler.spec.stats.drafted > 0  # the JSON before it was drafted from
    finally:
        plain.close()
        spec.close()
