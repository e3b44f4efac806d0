"""cpus.py: the plan that splits a machine's cores between workers, and the cpu-list form."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllmmlxd.runtime.cpus import CpuShare, can_pin, default_threads, format_cpus, parse_cpus, plan_shares


def cores(plan: dict[str, CpuShare]) -> dict[str, str]:
    return {name: share.render() for name, share in plan.items()}


def test_one_worker_gets_every_core_and_leaves_one_to_its_own_threads():
    plan = plan_shares({"a": None}, range(8))
    assert cores(plan) == {"a": "0-7"} and plan["a"].threads == 7 and not plan["a"].oversubscribed


def test_the_default_thread_count_is_one_fewer_than_the_cores_and_never_zero():
    assert [default_threads(n) for n in (1, 2, 3, 16)] == [1, 1, 2, 15]


def test_even_split_is_disjoint_and_the_first_entries_take_the_remainder():
    plan = plan_shares({"a": None, "b": None, "c": None}, range(8))
    assert cores(plan) == {"a": "0-2", "b": "3-5", "c": "6-7"}
    assert [s.threads for s in plan.values()] == [2, 2, 1]
    assert not any(s.oversubscribed for s in plan.values())


def test_explicit_threads_are_served_first_and_the_rest_split_what_is_left():
    plan = plan_shares({"a": None, "big": 4, "b": None}, range(8))
    assert cores(plan) == {"a": "0-1", "big": "2-5", "b": "6-7"}
    assert plan["big"].threads == 4


def test_a_machine_with_gaps_in_its_cpu_ids():
    assert cores(plan_shares({"a": None, "b": None}, [2, 3, 6, 7])) == {"a": "2-3", "b": "6-7"}


def test_more_workers_than_cores_wrap_around_and_say_so():
    plan = plan_shares({"a": None, "b": None, "c": None}, range(2))
    assert cores(plan) == {"a": "0", "b": "1", "c": "0"}
    assert all(s.oversubscribed and s.threads == 1 for s in plan.values())


def test_asking_for_more_threads_than_cores():
    plan = plan_shares({"a": 8}, range(2))
    assert cores(plan) == {"a": "0-1"} and plan["a"].threads == 8 and plan["a"].oversubscribed


def test_nothing_to_plan():
    assert plan_shares({}, range(4)) == {}
    assert plan_shares({"a": None}, []) == {}


@pytest.mark.parametrize(
    "ids, text",
    [([0], "0"), ([0, 1, 2, 3], "0-3"), ([0, 1, 2, 3, 6], "0-3,6"), ([5, 1, 3, 2], "1-3,5"), ([0, 2, 4], "0,2,4")],
)
def test_cpu_lists_round_trip(ids, text):
    assert format_cpus(ids) == text
    assert parse_cpus(text) == tuple(sorted(ids))


@pytest.mark.parametrize("bad", ["", "a", "3-1", "-1", "1,,2"])
def test_bad_cpu_lists_are_refused(bad):
    with pytest.raises(ValueError):
        parse_cpus(bad)


@pytest.mark.skipif(not can_pin() or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and two cores")
def test_pin_restricts_the_process_and_the_threads_it_starts():
    code = (
        "import os, threading; from vllmmlxd.runtime.cpus import pin, available_cpus; pin([1]);"
        "seen = [];"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0)))); t.start(); t.join();"
        "print(available_cpus(), seen[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(1,)", "[1]"]
