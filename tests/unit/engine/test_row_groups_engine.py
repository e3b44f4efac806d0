"""Rows joining a running batch on builtin:tiny keep their KV in groups of their own, and their
prompts' chunks and first passes ride on the batch's passes: each greedy answer is the one it gets alone, with
requests joining one by one (more groups than allowed, so neighbours merge), finishing in
between (groups dropped), and speculating."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib

import pytest

from vllmmlxd.engine.batch import row_groups
from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.speculation.speculative import SpeculationOptions
from vllmmlxd.engine.types import GenerationRequest, SamplingParams, TextDelta

ASKS = [f"Request {i}: " + " ".join(f"word{i * 7 + j}" for j in range(3 + 5 * i)) for i in range(7)]
LENGTHS = [200, 12, 150, 8, 120, 100, 80]  # two finish while later ones join; the long ones overlap


@pytest.fixture(scope="module")
def tiny(state_dir):
    from vllmmlxd.engine.loading.loader import load_model

    return load_model("builtin:tiny", state_dir)


def in_step_with_the_loop(eng: MLXEngine) -> dict:
    """Before each engine step, let the event loop take in what the last step delivered (and the
    requests that delivery starts) so joins land at the same step on any machine's pace."""
    held: dict = {}

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    def hook() -> None:
        loop = held.get("loop")
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(concurrent.futures.CancelledError, concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout=30)  # the run may end meanwhile

    eng.before_each_step(hook)
    return held


def run(eng: MLXEngine, staggered: bool, held: dict | None = None) -> list[str]:
    async def one(i: int, started: list[asyncio.Event]) -> str:
        if staggered and i:
            await started[i - 1].wait()  # joins once the one before it is decoding
        params = SamplingParams(max_tokens=LENGTHS[i], temperature=0.0, ignore_eos=True)
        out = ""
        async for event in eng.generate(GenerationRequest(eng.tokenize(ASKS[i]), params)):
            if isinstance(event, TextDelta):
                out += event.text
                started[i].set()
        return out

    async def all_of() -> list[str]:
        if held is not None:
            held["loop"] = asyncio.get_running_loop()
        started = [asyncio.Event() for _ in ASKS]
        try:
            return list(await asyncio.gather(*(one(i, started) for i in range(len(ASKS)))))
        finally:
            if held is not None:
                held.clear()

    return asyncio.run(all_of())


@pytest.fixture(scope="module")
def alone(tiny):
    eng = MLXEngine(tiny, options=EngineOptions(max_num_seqs=1))
    try:
        return run(eng, staggered=False)  # one at a time: no batch to join
    finally:
        eng.close()


@pytest.mark.parametrize("spec", [None, SpeculationOptions(num_draft=3, adaptive=False)], ids=["plain", "lookup"])
def test_requests_joining_one_by_one_answer_as_they_do_alone(tiny, alone, spec, monkeypatch):
    # Two groups at most: a third row alive merges neighbours, whatever the machine's pace.
    monkeypatch.setattr(row_groups, "MAX_GROUPS", 2)
    joined: list[int] = []
    extend = row_groups.GroupedKV.extend
    monkeypatch.setattr(row_groups.GroupedKV, "extend", lambda self, other: (joined.append(1), extend(self, other)))
    merge = row_groups.GroupedKV.merge
    merged: list[int] = []
    monkeypatch.setattr(row_groups.GroupedKV, "merge", lambda self, a, b: (merged.append(1), merge(self, a, b)))
    forward = row_groups.grouped_forward
    rode: list[int] = []

    def spied(model, segments, rider=None):
        rode.append(rider is not None)
        return forward(model, segments, rider)

    monkeypatch.setattr(row_groups, "grouped_forward", spied)
    priming = row_groups.RidingPrompts._priming
    primed: list[int] = []
    monkeypatch.setattr(
        row_groups.RidingPrompts, "_priming", lambda self, last: (primed.append(1), priming(self, last))[1]
    )
    eng = MLXEngine(tiny, options=EngineOptions(max_num_seqs=8, speculative=spec))
    held = in_step_with_the_loop(eng)  # without it, a slow test process let rows end before the next joined
    try:
        assert run(eng, staggered=True, held=held) == alone
    finally:
        eng.close()
    assert joined and merged  # rows joined as groups of their own, and past two groups neighbours merged
    assert any(rode)  # prompts' chunks rode on the batch's passes
    assert primed  # and joined with their first pass still to run, in the batch's next one
