from vllmmlxd.supervisor.slot.backoff import BackoffPolicy


def test_delay_grows_exponentially_up_to_the_cap():
    p = BackoffPolicy(initial_s=1, factor=2, max_s=5)
    assert [p.delay(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


def test_fast_crashes_accumulate_and_a_long_run_resets_them():
    p = BackoffPolicy(fast_crash_s=10, max_fast_crashes=3)
    n = p.next_fast_crashes(0, 1.0)
    n = p.next_fast_crashes(n, 2.0)
    assert n == 2 and not p.gives_up(n)
    assert p.gives_up(p.next_fast_crashes(n, 0.5))
    assert p.next_fast_crashes(n, 60.0) == 1
