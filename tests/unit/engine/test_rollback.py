"""Speculation on sliding-window and recurrent families: a rejected draft's positions are undone by
putting the caches back and feeding the kept tokens again (speculation/rollback.py).

The drafts here are an oracle's (mlx-lm's own greedy answer) with one wrong token in every few
steps, so every step's outcome is known by construction: rows keep different numbers of tokens
in the same pass, some keep all, some none; answers must be mlx-lm's, token for token."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import fidelity
from tests.support.families import VOCAB, build
from vllmmlxd.engine.batch.layout import read_layout
from vllmmlxd.engine.options import SpeculationOptions
from vllmmlxd.engine.speculation import rollback, speculative

ANSWER = 24


def oracle(monkeypatch: pytest.MonkeyPatch, prompts: list[list[int]], answers: list[tuple[int, ...]]) -> None:
    """Prompt lookup replaced by the answers themselves, wrong at one draft every third position."""

    def drafts(history: np.ndarray, ngram: int, k: int) -> list[int]:
        for prompt, answer in zip(prompts, answers):
            if len(history) >= len(prompt) and history[: len(prompt)].tolist() == prompt:
                at = len(history) - len(prompt)  # the pending token is answer[at]
                found = list(answer[at : at + k])
                if at % 3 == 1 and len(found) > 2:  # a wrong draft, kept rows differ in one pass
                    found[1 + at % 2] = (found[1 + at % 2] + 1) % VOCAB
                return found
        return []

    monkeypatch.setattr(speculative, "lookup_drafts", drafts)


def run(family: str, monkeypatch: pytest.MonkeyPatch) -> tuple[fidelity.Report, speculative.SpeculativeBatch]:
    monkeypatch.setattr(fidelity, "GENERATE", ANSWER)
    model = build(family, "float32")
    prompts = fidelity.prompts()[:3]  # unequal, two longer than the window
    refs = [fidelity.reference(model, p, ANSWER) for p in prompts]
    oracle(monkeypatch, prompts, [r.tokens for r in refs])
    spec = SpeculationOptions(num_draft=4, adaptive=False)
    driver = fidelity.Driver(model, fidelity.options(None, cache_budget_bytes=0, speculative=spec))
    try:
        answers, _ = driver.run(prompts)
        batch = driver.scheduler.spec
        assert batch is not None
    finally:
        driver.close()
    report = fidelity.Report(family, "float32")
    fidelity.compare(report, "batched", refs, answers)
    return report, batch


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3_5", "lfm2", "nemotron_h"])
def test_rejected_drafts_are_undone_and_answers_stay_mlx_lm_s(family, monkeypatch):
    assert read_layout(build(family, "float32")).rollback == "replay"
    report, batch = run(family, monkeypatch)
    assert not report.failures, report.summary()
    assert batch.replays > 0 and batch.stats.accepted > 0 and batch.stats.accepted < batch.stats.drafted


def test_without_the_replay_the_answers_depart(monkeypatch):
    monkeypatch.setattr(speculative, "restore", lambda saved: None)
    monkeypatch.setattr(speculative, "replay", lambda model, caches, emitted: None)
    report, _ = run("qwen3_5", monkeypatch)
    assert report.failures, "a recurrent state that kept rejected drafts should change the answers"


def test_a_snapshot_holds_copies_of_what_a_cache_changes_in_place():
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    cache = BatchKVCache([1, 0])
    cache.update_and_fetch(mx.zeros((2, 1, 3, 4)), mx.zeros((2, 1, 3, 4)))
    saved = rollback.snapshot([cache])
    cache.update_and_fetch(mx.ones((2, 1, 2, 4)), mx.ones((2, 1, 2, 4)))  # offset += in place
    rollback.restore(saved)
    assert cache.offset.tolist() == [2, 3] and cache.size() == 3


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_5"])
def test_a_model_whose_answer_repeats_its_prompt_keeps_every_draft(family, monkeypatch):
    """A model made predictable (families.predictable): its prompt runs through a cycle of tokens
    longer than the window, and prompt lookup's every draft is the model's own next token."""
    from tests.support.families import make

    monkeypatch.setattr(fidelity, "GENERATE", ANSWER)
    cycle = range(100, 160)
    model, _ = make(family, "float32", cycle=cycle)
    prompt = [*cycle, *cycle, *cycle[:30]]
    expected = [cycle[(30 + i) % len(cycle)] for i in range(ANSWER)]
    driver = fidelity.Driver(model, fidelity.options(None, cache_budget_bytes=0))
    try:
        [answer], _ = driver.run([prompt])
        batch = driver.scheduler.spec
        assert batch is not None
    finally:
        driver.close()
    assert answer == expected
    assert batch.stats.drafted > ANSWER // 2 and batch.stats.accepted == batch.stats.drafted
    assert batch.replays == 0  # every row kept every position: nothing to put back
