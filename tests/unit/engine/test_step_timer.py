"""step_timer.py: the prefill chunk that takes about a second at most and keeps a stream's gaps
under 1 + share decode steps."""

from __future__ import annotations

import pytest

from vllmmlxd.engine.step.step_timer import GROWTH, MIN_CHUNK, PREFILL_SHARE, RIDING_SHARE, StepTimer


def machine(timer: StepTimer, decode: float, per_call: float, per_token: float, chunks) -> None:
    """Feed the timer steps of a machine where a prefill call costs per_call + per_token * tokens."""
    timer.observe(decode, decoded=True, prefilled=0)
    for c in chunks:
        timer.observe(decode + per_call + per_token * c, decoded=True, prefilled=c)


def test_a_first_chunk_is_small_until_a_step_has_been_measured():
    timer = StepTimer()
    assert timer.chunk(512, decoding=False, prompts=1) == MIN_CHUNK  # alone: a few tokens tell the cost
    assert timer.chunk(512, decoding=True, prompts=1) == MIN_CHUNK * 2
    timer.observe(0.05, decoded=True, prefilled=0)
    assert timer.chunk(512, decoding=True, prompts=1) == MIN_CHUNK * 2  # no prefill measured: a small start
    assert timer.chunk(2, decoding=False, prompts=1) == 2  # never above the configured step
    assert StepTimer().chunk(512, decoding=False, prompts=8) == 1  # eight prompts: eight tokens in all


def test_alone_a_chunk_takes_about_a_second_at_most():
    # A slow machine (one BLAS thread): 512 tokens would take a minute; a chunk still ends within a second.
    timer = StepTimer(alpha=0.2)
    for c in (4, 5, 8, 6):
        timer.observe(0.010 + 0.1 * c, decoded=False, prefilled=c)
    assert timer.chunk(512, decoding=False, prompts=1) == 9  # (1 - 0.010) / 0.1 tokens
    assert timer.chunk(512, decoding=False, prompts=4) == 2  # the second is shared by the prompts
    assert timer.chunk(512, decoding=False, prompts=16) == 1  # a token each at least, not MIN_CHUNK each
    timer = StepTimer(alpha=0.2)
    for c in (4, 64, 32, 128):
        timer.observe(0.010 + 0.004 * c, decoded=False, prefilled=c)
    c = timer.chunk(512, decoding=False, prompts=1)
    assert c == int((1.0 - 0.010) / 0.004) and 0.010 + 0.004 * c <= 1.0  # 247 tokens, within the second
    assert timer.chunk(512, decoding=False, prompts=2) == c // 2  # the second is shared by the prompts
    assert timer.chunk(128, decoding=False, prompts=1) == 128  # a fast machine: the configured step


def test_a_slow_decode_step_does_not_stretch_the_chunk_past_the_second():
    timer = StepTimer(alpha=0.2, share=2.0)
    machine(timer, 2.0, 0.010, 0.004, [4, 64, 32, 128])  # decode steps of 2 s: share allows 4 s
    assert timer.budget_s(decoding=True) == 1.0
    assert timer.chunk(512, decoding=True, prompts=1) == int((1.0 - 0.010) / 0.004)


def test_the_fit_recovers_the_cost_of_a_call_and_of_a_token():
    timer = StepTimer(alpha=0.2)
    machine(timer, 0.047, 0.060, 0.008, [8, 16, 4, 32, 8, 16])
    per_call, per_token = timer.cost()
    assert per_call == pytest.approx(0.060, rel=1e-6) and per_token == pytest.approx(0.008, rel=1e-6)


def test_the_chunk_keeps_a_step_within_one_plus_share_decode_steps():
    timer = StepTimer(alpha=0.2, share=2.0)
    machine(timer, 0.050, 0.020, 0.004, [8, 16, 4, 32])
    c = timer.chunk(512, decoding=True, prompts=1)
    assert c == int((2.0 * 0.050 - 0.020) / 0.004)  # 20 tokens
    assert 0.050 + 0.020 + 0.004 * c <= 3 * 0.050 + 1e-9
    assert timer.chunk(512, decoding=True, prompts=4) == 5  # shared between the prompts
    assert timer.chunk(10, decoding=True, prompts=1) == 10  # never above the configured step


def test_a_call_that_alone_exceeds_the_budget_still_advances_by_the_minimum():
    timer = StepTimer(alpha=0.2, share=2.0)
    machine(timer, 0.047, 0.200, 0.008, [4, 8, 16])
    assert timer.chunk(512, decoding=True, prompts=1) == MIN_CHUNK


def test_one_chunk_size_seen_is_taken_as_proportional():
    timer = StepTimer(alpha=0.2, share=2.0)
    machine(timer, 0.050, 0.0, 0.005, [8, 8, 8])
    assert timer.cost() == pytest.approx((0.0, 0.005))
    assert timer.chunk(512, decoding=True, prompts=1) == 20


def test_steps_that_say_nothing_are_ignored_and_prefill_alone_counts_whole():
    timer = StepTimer(alpha=1.0)
    timer.observe(0.5, decoded=False, prefilled=0)
    assert timer.decode_s is None and timer.cost() is None
    timer.observe(0.2, decoded=False, prefilled=100)  # no decode in this step: all of it was prefill
    assert timer.cost() == pytest.approx((0.0, 0.002))


def test_a_fit_from_small_steps_is_trusted_only_a_few_times_further():
    timer = StepTimer(alpha=0.2)
    # Two small steps whose noise makes a token look nearly free: the fit alone would say 512.
    timer.observe(0.500, decoded=False, prefilled=4)
    timer.observe(0.5001, decoded=False, prefilled=8)
    assert timer.chunk(512, decoding=False, prompts=1) == GROWTH * 8
    timer.observe(0.51, decoded=False, prefilled=32)
    assert timer.chunk(512, decoding=False, prompts=1) == GROWTH * 32
    assert timer.chunk(512, decoding=False, prompts=4) == 32  # the step's tokens, shared


def test_steps_that_overrun_their_gap_shrink_the_next_chunks_until_they_fit():
    # The fit says a + b * tokens, but each chunk now costs 1.6 times that (a prompt's prefix grows;
    # a prefilling step hides less of its decode): feedback brings the steps back within the gap.
    timer = StepTimer(alpha=0.2, share=1.5)
    decode, per_call, per_token = 0.100, 0.050, 0.010
    machine(timer, decode, per_call, per_token, [4, 8, 16, 8])
    steps = []
    for _ in range(12):
        c = timer.chunk(512, decoding=True, prompts=1)
        steps.append(decode + 1.6 * (per_call + per_token * c))
        timer.observe(steps[-1], decoded=True, prefilled=c)
    target = (1 + 1.5) * decode
    assert steps[0] > 1.25 * target  # the model alone overruns
    assert all(s <= 1.08 * target for s in steps[-4:]) and timer.scale < 1.0


def test_steps_that_come_in_short_let_the_chunks_grow_back():
    timer = StepTimer(alpha=0.2, share=1.5)
    machine(timer, 0.100, 0.050, 0.010, [4, 8, 16, 8])
    timer.scale = 0.3  # after a slow spell
    for _ in range(20):
        c = timer.chunk(512, decoding=True, prompts=1)
        timer.observe(0.100 + 0.050 + 0.010 * c, decoded=True, prefilled=c)  # the model is right again
    assert 0.9 <= timer.scale <= 1.1


def test_a_chunk_riding_on_a_decode_pass_may_be_a_single_token():
    # Riding, a chunk costs its own tokens only (no second read of the weights): where a token of
    # it costs as much as the budget allows, one token a step, not MIN_CHUNK.
    timer, plain = StepTimer(alpha=0.5), StepTimer(alpha=0.5)
    timer.riding = True
    assert timer.chunk(512, decoding=True, prompts=1) == 2 and timer.chunk(512, decoding=False, prompts=1) == MIN_CHUNK
    for t in (timer, plain):
        t.observe(0.050, decoded=True, prefilled=0)
        for c in (1, 2, 1, 2):
            t.observe(0.050 + 0.070 * c, decoded=True, prefilled=c)  # 70 ms a token: a decode step's share fits none
    assert timer.chunk(512, decoding=True, prompts=1) == 1
    assert plain.chunk(512, decoding=True, prompts=1) == MIN_CHUNK
    assert timer.budget_s(decoding=True) == pytest.approx(RIDING_SHARE * 0.050)  # a smaller share riding
    assert plain.budget_s(decoding=True) == pytest.approx(PREFILL_SHARE * 0.050)
