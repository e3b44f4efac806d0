"""tuning.py: the supervisor's timings and their environment overrides."""

from vllmmlxd.supervisor.slot.tuning import Tuning


def test_defaults_without_overrides():
    t = Tuning.from_env({})
    assert (t.health_interval_s, t.health_failures, t.ready_timeout_s) == (10.0, 3, 900.0)
    assert t.policy.max_fast_crashes == 5


def test_overrides_from_the_environment():
    t = Tuning.from_env(
        {
            "VLLMMLXD_HEALTH_INTERVAL_S": "0.5",
            "VLLMMLXD_HEALTH_FAILURES": "2",
            "VLLMMLXD_READY_TIMEOUT_S": "3",
            "VLLMMLXD_BACKOFF_INITIAL_S": "0.1",
            "VLLMMLXD_MAX_FAST_CRASHES": "4",
            "VLLMMLXD_HEALTH_TIMEOUT_S": "",
        }
    )
    assert (t.health_interval_s, t.health_failures, t.ready_timeout_s, t.health_timeout_s) == (0.5, 2, 3.0, 5.0)
    assert (t.policy.initial_s, t.policy.max_fast_crashes) == (0.1, 4)
