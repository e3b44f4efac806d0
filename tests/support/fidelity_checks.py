"""What a fidelity test asserts of a family's report (tests/support/fidelity.py), shared by the
test files that split the families between the suite's processes."""

from __future__ import annotations

from tests.support.fidelity import GENERATE, LENGTHS, PATHS, Report, expected_reuse

# The paths whose answers a path's prompts are served from (their KV was kept in the cache).
STORED_BEFORE = {
    "batched": (),
    "again": ("batched",),
    "extended": ("batched", "again"),
    "shared": ("batched", "again", "extended"),
    "disk": ("batched", "again", "extended", "shared"),
}


def assert_faithful(report: Report) -> None:
    """Every path gave mlx-lm's answer (near-ties aside), most of every answer was compared, the
    cache served what its kind promises on each path, and speculation drafted where it may."""
    assert not report.failures, report.summary()
    total = len(PATHS) * len(LENGTHS) * GENERATE
    # A near-tie ends the comparison of its answer: most tokens must still have been compared.
    assert report.compared >= 0.8 * total, f"{report.family}/{report.precision}: {report.compared} of {total} compared"
    for path, cached in report.cached.items():
        floor = [expected_reuse(report.prefix_cache, path, n) for n in LENGTHS]
        # After a near-tie an answer kept in the cache is not the reference's, which the next paths extend.
        floor = [0 if report.departed(i, STORED_BEFORE[path]) else f for i, f in enumerate(floor)]
        assert all(c >= f for c, f in zip(cached, floor)), (report.family, report.precision, path, cached, floor)
    if report.speculates:
        assert report.drafted > 0, f"{report.family}/{report.precision}: no draft was verified"
