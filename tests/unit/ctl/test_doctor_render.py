"""``vllmmlxctl doctor``'s report (vllmmlxd/ctl/doctor_render.py): a line per check, the verdict
naming what failed, and the same as data."""

from __future__ import annotations

from vllmmlxd.ctl.doctor_checks import Check
from vllmmlxd.ctl.doctor_render import render_text, to_json

CHECKS = [
    Check("versions", "mlx", "ok", "0.32.4"),
    Check("service", "daemon", "warn", "not answering"),
    Check("engine", "batch", "ok", "24 tokens as mlx-lm's", 0.156),
    Check("engine", "prefix_cache", "fail", "differs from mlx-lm: prompt 0 token 0", 0.2),
]


def test_the_text_has_a_title_per_part_a_line_per_check_and_names_the_failure():
    text = render_text("vllmmlxctl doctor: vllmmlxd 0.1.0", CHECKS).splitlines()
    assert text[0] == "vllmmlxctl doctor: vllmmlxd 0.1.0"
    assert text[1] == "versions" and text[2] == "  ok    mlx           0.32.4"
    assert "  warn  daemon        not answering" in text
    assert "  ok    batch         24 tokens as mlx-lm's (0.16 s)" in text
    assert "  FAIL  prefix_cache  differs from mlx-lm: prompt 0 token 0 (0.20 s)" in text
    assert text[-1] == "FAILED: engine.prefix_cache"


def test_warnings_alone_pass():
    text = render_text("h", CHECKS[:3])
    assert text.splitlines()[-1] == "all checks passed (1 warning)"


def test_the_json_holds_the_same_checks_and_the_failed_parts():
    data = to_json("h", CHECKS, {"model": "builtin:tiny"})
    assert data["ok"] is False and data["failed"] == ["engine.prefix_cache"]
    assert data["checks"][3] == {
        "part": "engine",
        "name": "prefix_cache",
        "level": "fail",
        "detail": "differs from mlx-lm: prompt 0 token 0",
        "seconds": 0.2,
        "data": {},
    }
    assert data["selftest"] == {"model": "builtin:tiny"} and data["summary"] == "FAILED: engine.prefix_cache"
