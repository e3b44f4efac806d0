"""types.py: the latency histogram and the recent token rate the engine keeps."""

from __future__ import annotations

from vllmmlxd.engine.types import LatencyHistogram, RecentRate


def test_histogram_counts_are_cumulative_with_a_sum():
    h = LatencyHistogram((0.1, 1.0))
    for s in (0.05, 0.5, 5.0):
        h.observe(s)
    assert h.counts == [1, 2] and h.count == 3 and h.total == 5.55


def test_recent_rate_covers_only_the_window():
    r = RecentRate(window=10)
    assert r.rate(0) == 0.0
    for t in range(0, 31):
        r.note(float(t), t * 5)  # 5 tokens a second
    assert r.rate(30.0) == 5.0
    assert r.rate(100.0) == 0.0  # nothing in the last 10 s
    assert len(r.samples) <= 12
