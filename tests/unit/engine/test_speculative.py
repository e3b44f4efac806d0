"""Speculative decoding inside the batch: the pure choices (lookup, width, pauses), and the
scheduler over the real BatchGenerator and the weightless counting model, whose KV holds each
position's token id, so a row's cache read back after drafts were accepted and rejected must
be exactly its tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.unit.engine.scheduler_fakes import CountingModel, FakeClock, Harness, decode_ids
from vllmmlxd.engine.speculation.draft_width import StepCosts, best_width, expected_accepted
from vllmmlxd.engine.speculation.speculative import (
    MAX_PAUSE,
    PAUSE_AFTER,
    RowDrafting,
    SpeculationOptions,
    lookup_drafts,
)
from vllmmlxd.engine.step.sequence import Sequence


@pytest.mark.parametrize(
    "history, ngram, k, drafts",
    [
        ([5, 6, 7, 8, 9, 1, 5, 6, 7], 3, 4, [8, 9, 1, 5]),  # the 3 last tokens occurred before
        ([5, 6, 7, 8, 5, 6, 7, 2, 6, 7], 3, 3, [2, 6, 7]),  # (6, 7) only: the latest occurrence wins
        ([1, 2, 3, 4, 5], 3, 4, []),  # nothing repeats
        ([9, 9, 9, 9, 9], 2, 2, [9, 9]),  # in a run, an occurrence followed by k tokens
        ([9, 9, 9], 2, 2, [9]),  # none is followed by k: the latest, up to the end
        ([3, 1, 4, 1, 5, 1], 1, 2, [5, 1]),  # ngram 1: single tokens
        ([3, 1, 4, 1, 5, 1], 2, 2, []),  # ngram 2 never falls back to single tokens
    ],
)
def test_prompt_lookup_takes_what_followed_the_latest_earlier_occurrence(history, ngram, k, drafts):
    assert lookup_drafts(np.array(history, np.int64), ngram, k) == drafts


def linear(plain: float, per_position: float, rows: int):
    """A step's seconds by width: ``plain`` plus ``per_position`` for each drafted position of ``rows`` rows."""
    return lambda width: plain + per_position * rows * width


def test_the_width_is_the_one_with_the_most_tokens_per_second():
    assert expected_accepted(0.5, 0) == 0 and expected_accepted(1.0, 4) == 4
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert best_width([4, 2, 0], [0.9, 0.9, 0.1], None) == 4  # nothing measured yet: all of it
    weight_bound = linear(0.040, 0.0001, 2)  # reading the weights dominates
    assert best_width([4, 4], [0.8, 0.8], weight_bound) == 4
    compute_bound = linear(0.016, 0.010, 16)  # each token costs: with 16 rows, drafts that rarely land are not worth it
    assert best_width([4] * 16, [0.1] * 16, compute_bound) == 0
    assert best_width([4] * 16, [0.1] * 16, compute_bound, avoid=0) >= 1  # the runner-up: the best above 0
    assert best_width([0, 0], [0.9, 0.9], weight_bound) == 0
    one_thread_cpu = linear(0.050, 0.0095, 1)  # SmolLM2 on one BLAS thread: a plain step, a verified draft
    assert best_width([8], [0.9], one_thread_cpu) >= 4 and best_width([8], [0.15], one_thread_cpu) == 0


def test_a_width_whose_pass_costs_little_more_wins_over_a_wider_one_that_jumps():
    # Measured on one BLAS thread, SmolLM2 (ms): 1, 2 and 3 positions a row cost 69, 77 and 87;
    # 4 cost 117 (the BLAS library's small products jump there), 9 cost 178.
    measured = {0: 0.069, 1: 0.077, 2: 0.087, 3: 0.117, 4: 0.131, 8: 0.178}
    cost = lambda width: measured.get(width, 0.178)  # noqa: E731
    assert best_width([8], [0.85], cost) == 2
    assert best_width([8], [0.85], linear(0.069, 0.0136, 1)) > 2  # a straight line through 1 and 9 says wider
    assert best_width([8], [0.85], cost, avoid=2) != 2


def test_step_costs_time_each_step_from_its_start_to_the_next_and_skip_steps_that_did_more():
    fit: list = [None]  # the step timer's prefill fit, as it changes
    costs = StepCosts(lambda: fit[0], alpha=0.5)
    assert costs.cost(1) is None
    fit[0] = (0.02, 0.01)
    first = costs.cost(1)
    assert first is not None and first(0) == pytest.approx(0.03) and first(2) == pytest.approx(0.05)
    for start, last, alone in [
        (0.0, (2, 0), True),  # a plain step of 2 rows: 40 ms
        (0.040, (2, 0), True),  # another: 60 ms
        (0.100, (2, 4), True),  # verifying width 4 (8 drafted positions): 130 ms, 80 more than a plain step
        (0.230, (2, 0), False),  # it also prefilled: not its own cost
        (0.900, (2, 0), True),
    ]:
        costs.lap(start)
        costs.last = last
        costs.ended(alone=alone)
    costs.lap(0.950)
    assert costs.plain == {2: pytest.approx(0.050)}  # 40 ms, then 60 at alpha 0.5: 50; then 50 again
    assert costs.verify == {(2, 4): pytest.approx(0.130)}
    assert costs.per_draft == pytest.approx(0.080 / 8)
    two = costs.cost(2)
    assert two is not None
    assert two(0) == pytest.approx(0.050) and two(4) == pytest.approx(0.130)  # measured
    assert two(1) == pytest.approx(0.050 + 0.010 * 2)  # not measured: the plain step and the average position
    three = costs.cost(3)
    assert three is not None and three(0) == pytest.approx(0.05)  # no plain step of 3 rows yet: the fit's
    assert three(4) == pytest.approx(0.05 + 0.010 * 12)  # nor a verifying one: priced, not the 2 rows' 130 ms
    fit[0] = (1.0, 1.0)
    again = costs.cost(2)
    assert again is not None and again(0) == pytest.approx(0.050)  # measured beats the prefill fit


def test_one_slow_verifying_step_moves_its_widths_cost_a_little():
    costs = StepCosts(alpha=0.5)
    for start, last in [(0.0, (1, 0)), (0.050, (1, 2)), (0.130, (1, 2)), (0.210, (1, 2)), (2.0, (1, 0))]:
        costs.lap(start)
        costs.last = last
        costs.ended(alone=True)
    costs.lap(2.05)
    # 80 ms twice, then a 1.79 s pause: taken as at most twice the 80 ms known, so 120 ms
    assert costs.verify[(1, 2)] == pytest.approx(0.120)


def test_a_rows_acceptance_counts_only_the_drafts_that_were_tried():
    row = RowDrafting(enabled=True, alpha=0.0)
    row.record(8, 4)  # four kept, the fifth rejected, three never tried: 4 of 5
    assert row.alpha == pytest.approx(0.3 * 4 / 5)
    row = RowDrafting(enabled=True, alpha=0.0)
    row.record(4, 4)  # all kept
    assert row.alpha == pytest.approx(0.3)


def test_a_row_whose_drafts_keep_failing_pauses_longer_each_time_and_an_acceptance_resets_it():
    row = RowDrafting(enabled=True)
    for _ in range(PAUSE_AFTER - 1):
        row.record(4, 0)
    assert row.pause == 0
    row.record(4, 0)
    first = row.pause
    row.pause = 0
    row.record(4, 0)
    assert row.pause > first
    for _ in range(20):
        row.record(4, 0)
    assert row.pause == MAX_PAUSE
    row.record(4, 2)
    assert row.misses == 0 and row.alpha > 0 and (row.drafted, row.accepted) == (4 * (PAUSE_AFTER + 22), 2)


def harness(speculative: bool, **kw) -> Harness:
    """A scheduler whose model reads its weights once a pass (a token costs little beside it), as
    a decoder does on Apple Silicon: drafting pays even when some rows only pad."""
    spec = SpeculationOptions(num_draft=4, ngram=3) if speculative else None
    return Harness(per_call=0.04, per_token=0.0001, speculative=spec, **kw)


PROMPTS = [
    [5, 6, 7, 8, 9, 100, 5, 6, 7],  # drafts [8, 9, 100, 5]: two accepted, then a rejection
    list(range(20, 31)) + list(range(20, 26)),  # drafts [27, 28, 29, 30]: all accepted, a bonus token
    list(range(200, 209)),  # nothing to look up: never drafts
]


def run(hz: Harness, prompts, max_tokens=12, **sampling) -> tuple[list[str], list[Sequence]]:
    seqs = [hz.submit(p, max_tokens=max_tokens, **sampling) for p in prompts]
    hz.finish(*seqs)
    return [hz.text(s) for s in seqs], seqs


def stored(hz: Harness, tokens: list[int]) -> list[int]:
    hit = hz.scheduler.cache.lookup([*tokens, 7])
    assert hit.cached_tokens == len(tokens)
    assert hit.cache is not None
    return hit.cache[0].keys[0, 0, : hit.cached_tokens, 0].astype(mx.int32).tolist()


def test_drafts_accepted_and_rejected_in_one_batch_give_the_plain_batchs_tokens_and_kv():
    plain, spec = harness(False), harness(True)
    texts, _ = run(plain, PROMPTS)
    spec_texts, seqs = run(spec, PROMPTS)
    assert spec_texts == texts
    stats = spec.scheduler.spec.stats
    assert stats.drafted > stats.accepted > 0 and stats.steps > 0
    assert seqs[2].progress.drafted_tokens == 0 and seqs[1].progress.accepted_tokens >= 4
    for prompt, seq in zip(PROMPTS, seqs):  # each row's KV, stored as it finished, is its tokens exactly
        generated = [int(t) for t in decode_ids_back(spec.text(seq))]
        tokens = prompt + generated[:-1]  # the last token was sampled, never fed
        assert stored(spec, tokens) == tokens
    # A row whose drafts land needs fewer forward passes than the plain batch does.
    plain, spec = harness(False), harness(True)
    assert run(plain, PROMPTS[1:2])[0] == run(spec, PROMPTS[1:2])[0]
    assert len(spec.model.calls) < len(plain.model.calls)


def decode_ids_back(text: str) -> list[int]:
    return [int(part) for part in text.strip("<>").split("><")]


def test_a_request_that_opts_out_never_drafts_beside_one_that_does():
    spec = harness(True)
    out = spec.submit(PROMPTS[1], max_tokens=12, speculative=False)
    drafting = spec.submit(PROMPTS[1], max_tokens=12)
    spec.finish(out, drafting)
    assert out.progress.drafted_tokens == 0 and drafting.progress.drafted_tokens > 0
    assert spec.text(out) == spec.text(drafting)


def test_drafts_never_run_past_max_tokens():
    spec = harness(True)
    texts, [seq] = run(spec, [PROMPTS[1]], max_tokens=3)
    assert texts == [decode_ids([26, 27, 28])] and seq.progress.generated_tokens == 3


def test_a_draft_model_of_the_target_itself_is_always_right():
    spec = harness(True, draft=CountingModel(FakeClock()))  # the target's own rule: every draft is its next token
    texts, _seqs = run(spec, [list(range(300, 310))], max_tokens=16)
    assert texts == [decode_ids(list(range(310, 326)))]
    stats = spec.scheduler.spec.stats
    assert stats.drafted > 0 and stats.accepted == stats.drafted
