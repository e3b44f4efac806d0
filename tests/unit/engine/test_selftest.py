"""The doctor's engine self-test (vllmmlxd/engine/selftest/): the near-tie rule the fidelity tests
share, and how a path's comparison becomes its verdict. The whole self-test on builtin:tiny runs
in tests/integration/test_doctor.py."""

from __future__ import annotations

from dataclasses import dataclass

from vllmmlxd.engine.selftest import engine_paths
from vllmmlxd.engine.selftest.agreement import Report, compare, near_tie, tie


@dataclass(frozen=True)
class Ref:
    tokens: tuple[int, ...]
    margins: tuple[float, ...]
    logprobs: tuple[float, ...] = ()


def test_a_near_tie_is_a_margin_rounding_explains():
    assert near_tie("float32", 5e-4, 0.0) and not near_tie("float32", 0.01, 0.0)
    assert near_tie("float32", 0.01, 0.006)  # twice mlx-lm's own rounding
    assert tie("bfloat16") == tie("q4") == 0.1  # the lower precisions share the half-precision tie


def test_compare_tolerates_a_near_tie_fails_a_wide_margin_and_a_short_answer():
    report = Report("m", "float32")
    refs = [Ref((1, 2, 3), (0.5, 1e-4, 0.5)), Ref((1, 2, 3), (0.5, 0.5, 0.5)), Ref((4, 5), (1.0, 1.0))]
    compare(report, "p", refs, [[1, 9, 9], [1, 9, 3], [4]])
    tolerated, wide, short = report.departures
    assert tolerated.tolerated and tolerated.position == 1  # the rest of that answer is not compared
    assert not wide.tolerated and wide.describe() == "p prompt 1 token 1: 9 for 2 at margin 0.5000"
    assert not short.tolerated and short.got is None
    assert report.failures == [wide, short] and report.compared == 2 + 2 + 2
    report.departures.clear()
    compare(report, "q", [Ref((1,), (0.1,))], [[1, 7]])
    assert report.departures[0].describe() == "q prompt 0: 2 tokens for 1"


def test_compare_takes_a_paths_own_rounding():
    report = Report("m", "float32", rounding=0.0)
    compare(report, "kv", [Ref((1,), (0.02,))], [[2]], rounding=0.02)
    assert report.departures[0].tolerated


def test_where_tokens_agree_their_log_probabilities_must_too():
    report = Report("m", "float32")
    refs = [Ref((1, 2, 3), (0.5, 0.5, 0.5), (-1.0, -2.0, -3.0))] * 2
    compare(report, "p", refs, [[1, 2, 3], [1, 2, 3]], logprobs=[[-1.0, -2.0005, -3.0], [-1.0, -2.05, -3.0]])
    (moved,) = report.departures  # 5e-4 is float32's rounding; 0.05 is not
    assert not moved.tolerated and moved.prompt == 1 and moved.position == 1
    assert moved.describe() == "p prompt 1 token 1: log-probability -2.0500 for -2.0000"
    assert report.logprobs_compared == 3 + 2
    rounded = Report("m", "q4")  # half precision rounds more
    compare(rounded, "p", refs[:1], [[1, 2, 3]], logprobs=[[-1.0, -2.05, -3.0]])
    assert rounded.departures == []


def test_the_prompts_repeat_their_first_half_and_follow_ups_share_a_prefix():
    prompts = engine_paths.make_prompts(lambda text: list(range(10)))  # a short text: repeated to length
    assert [len(p) for p in prompts] == [2 * n for n in engine_paths.HALVES]
    assert all(p[: len(p) // 2] == p[len(p) // 2 :] for p in prompts)
    answers = [(7, 7), (8, 8), (9, 9)]
    blocks = engine_paths.follow_ups(prompts, answers, [5, 5], "blocks")
    assert blocks[0] == prompts[0] + [7, 7, 5, 5]
    assert blocks[2] == [*prompts[2][: len(prompts[2]) * 3 // 4], 5, 5]  # a new chat on the same start
    assert engine_paths.follow_ups(prompts, answers, [5], "sequences")[2] == prompts[2] + [9, 9, 5]


def test_a_paths_verdict_names_what_went_wrong():
    report = Report("m", "float32")
    compare(report, "prefix_cache", [Ref((1, 2), (0.5, 0.5))], [[1, 2]])
    ok = engine_paths.judge("prefix_cache", report, 0.1234, cached=[40])
    assert ok.level == "ok" and ok.detail == "2 tokens as mlx-lm's, 40 prompt tokens from the cache"
    both = Report("m", "float32")
    compare(both, "batch", [Ref((1, 2), (0.5, 0.5), (-1.0, -1.0))], [[1, 2]], logprobs=[[-1.0, -1.0]])
    assert engine_paths.judge("batch", both, 0.1).detail == "2 tokens and their log-probabilities as mlx-lm's"
    assert ok.seconds == 0.123
    unused = engine_paths.judge("prefix_cache", report, 0.1, cached=[40, 0])
    assert unused.level == "fail" and "not reused" in unused.detail
    assert engine_paths.judge("speculation", report, 0.1, drafted=0).level == "fail"
    compare(report, "batch", [Ref((1, 2), (0.5, 0.5))], [[3, 2]])
    broken = engine_paths.judge("batch", report, 0.1)
    assert (
        broken.level == "fail"
        and broken.detail == "differs from mlx-lm: batch prompt 0 token 0: 3 for 1 at margin 0.5000"
    )
