"""Fidelity harness (tests/support/fidelity.py), families with recurrent layers (gated delta,
Mamba-2, short convolutions) beside attention: their prefix cache checkpoints the state at
block ends, and a sequence continues from the last checkpoint within what it shares."""

from __future__ import annotations

import mlx.core as mx
import pytest

from tests.support.families import PRECISIONS
from tests.support.fidelity import check
from tests.support.fidelity_checks import assert_faithful
from vllmmlxd.engine.batch import upstream_fixes
from vllmmlxd.engine.cache import layered_kv

FAMILIES = ("qwen3_next", "qwen3_5", "lfm2", "nemotron_h")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_engine_path_answers_as_mlx_lm_does(family, precision, tmp_path):
    assert_faithful(check(family, precision, tmp_path))


def test_the_harness_fails_an_engine_that_continues_from_a_checkpoint_of_another_position(tmp_path, monkeypatch):
    join = layered_kv.LayeredKV.join

    def stale(self, blocks, n, state=None):  # the state as if no token had been read
        return join(self, blocks, n, tuple(tuple(mx.zeros_like(a) for a in layer) for layer in state or ()) or None)

    monkeypatch.setattr(layered_kv.LayeredKV, "join", stale)
    report = check("qwen3_5", "float32", tmp_path, paths=("again", "extended"))
    assert {d.path for d in report.failures} >= {"again", "extended"}, report.departures


def test_the_harness_fails_nemotron_h_batched_without_its_carried_fix(tmp_path):
    with upstream_fixes.unapplied("nemotron_h_ssm_lengths"):
        report = check("nemotron_h", "float32", tmp_path)
    assert report.failures, "batching changes Nemotron-H's answers without the fix: see upstream_fixes"
