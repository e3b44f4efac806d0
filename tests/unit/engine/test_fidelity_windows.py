"""Fidelity harness (tests/support/fidelity.py), sliding-window families: their prefix cache's
blocks hold the windowed layers' KV too, and a sequence continues from any position."""

from __future__ import annotations

import pytest

from tests.support.families import PRECISIONS
from tests.support.fidelity import check
from tests.support.fidelity_checks import assert_faithful
from vllmmlxd.engine.batch import row_groups, upstream_fixes
from vllmmlxd.engine.cache import layered_kv

FAMILIES = ("gemma3_text", "gemma4_text", "gpt_oss")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_engine_path_answers_as_mlx_lm_does(family, precision, tmp_path):
    assert_faithful(check(family, precision, tmp_path))


def test_the_harness_fails_an_engine_whose_window_misses_a_block(tmp_path, monkeypatch):
    join = layered_kv.LayeredKV._join_windows

    def short(self, blocks, n, out):  # the window's oldest block is left out
        join(self, blocks, n, out)
        for i in self.windows:
            c = out[i]
            if c.keys is not None and c.keys.shape[2] > self.block:
                c.keys, c.values = c.keys[..., self.block :, :], c.values[..., self.block :, :]
                c._idx = c.keys.shape[2]

    monkeypatch.setattr(layered_kv.LayeredKV, "_join_windows", short)
    report = check("gemma3_text", "float32", tmp_path, paths=("again", "extended"))
    assert {d.path for d in report.failures} & {"again", "extended"}, report.departures


def test_the_harness_fails_mlx_lm_s_batched_window_without_its_carried_fix(tmp_path):
    with upstream_fixes.unapplied("batch_rotating_mask_after_rotation"):
        report = check("gemma4_text", "float32", tmp_path)
    assert report.failures, "mlx-lm's batched window masks rows right after a one-token chunk: see upstream_fixes"


def test_the_harness_fails_an_engine_whose_row_groups_take_each_other_s_masks(tmp_path, monkeypatch):
    make_mask = row_groups.GroupedKV.make_mask

    def swapped(self, N, **kwargs):  # the groups' masks in the wrong order
        mask = make_mask(self, N, **kwargs)
        return row_groups.GroupedMask(mask.parts[::-1])

    monkeypatch.setattr(row_groups.GroupedKV, "make_mask", swapped)
    report = check("gemma3_text", "float32", tmp_path, paths=("batched", "again"))
    assert {d.path for d in report.failures} & {"batched", "again"}, report.departures


def test_a_long_answer_s_next_turn_reuses_all_of_it_though_the_answer_outgrew_the_window(monkeypatch):
    from tests.support import fidelity
    from tests.support.families import WINDOW, build

    monkeypatch.setattr(fidelity, "GENERATE", 150)  # longer than the window (64) twice over
    model = build("gemma3_text", "float32")
    prompt = fidelity.prompts()[1]
    driver = fidelity.Driver(model, fidelity.options(None))
    try:
        [answer], _ = driver.run([prompt])
        turn = prompt + answer + [5, 6, 7]
        [again], [cached] = driver.run([turn])
    finally:
        driver.close()
    assert len(answer) == 150 > 2 * WINDOW
    assert cached == len(prompt) + len(answer)  # the answer's blocks were cut while in the window
    assert again == list(fidelity.reference(model, turn, 150).tokens)
