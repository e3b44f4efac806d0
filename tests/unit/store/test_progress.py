"""A download's speed and time left come from its last seconds only."""

from vllmmlxd.store.progress import Rate, eta_s, percent


def test_the_rate_is_measured_over_the_recent_window():
    rate = Rate(window_s=10)
    assert rate.per_s() is None
    rate.add(0.0, 0)
    rate.add(0.2, 100)
    assert rate.per_s() is None  # too soon to say
    for t in range(1, 31):  # 1 MB/s for 30 s, then 4 MB/s
        rate.add(float(t), t * 1_000_000)
    for t in range(31, 45):
        rate.add(float(t), 30_000_000 + (t - 30) * 4_000_000)
    assert rate.per_s() == 4_000_000  # the slow start is forgotten


def test_a_file_started_over_clears_the_samples():
    rate = Rate()
    rate.add(0.0, 5_000_000)
    rate.add(1.0, 6_000_000)
    rate.add(2.0, 100)  # a connection restarted a file from zero
    assert rate.per_s() is None


def test_time_left_and_percent():
    assert eta_s(25, 125, 10.0) == 10.0
    assert eta_s(25, None, 10.0) is None and eta_s(25, 125, None) is None and eta_s(25, 125, 0.0) is None
    assert percent(37, 100) == 37.0 and percent(1, 3) == 33.3 and percent(5, None) is None
    assert percent(0, 0) == 100.0 and percent(150, 100) == 100.0


def test_a_pulls_rate_is_timed_by_its_child_even_when_its_lines_are_read_at_once():
    from vllmmlxd.store.pulls import Pull, Source

    pull = Pull("p1", Source("org/model"))
    # A busy reader took all of these in the same instant: the child's own times say 2 MB/s.
    pull.apply({"event": "listed", "t": 0.1, "commit": "c", "total": 4_000_000, "files": 1, "have": 0})
    pull.apply({"event": "progress", "t": 0.6, "done": 1_000_000})
    pull.apply({"event": "progress", "t": 1.1, "done": 2_000_000})
    assert pull.view().bytes_per_s == 2_000_000.0


def test_a_new_childs_clock_clears_the_samples():
    rate = Rate()
    rate.add(5.0, 1_000_000)
    rate.add(6.0, 2_000_000)
    rate.add(0.1, 2_500_000)  # a resumed pull's new child counts from its own start
    assert rate.per_s() is None
