"""Disk admission: a pull that does not fit is refused before it starts, with the numbers."""

from vllmmlxd.store.disk import GB, DiskNeed, format_bytes, refusal


def test_a_pull_that_fits_beside_the_reserve_is_admitted():
    assert refusal("org/m", DiskNeed(need_bytes=4 * GB, files=2, have_bytes=0, free_bytes=6 * GB, where="/d")) is None


def test_a_pull_that_does_not_fit_is_refused_with_its_numbers():
    why = refusal(
        "org/m", DiskNeed(need_bytes=14_200_000_000, files=3, have_bytes=0, free_bytes=2_100_000_000, where="/d")
    )
    assert why == (
        "not enough disk space to pull org/m: it needs 14.2 GB more in 3 files; /d has 2.10 GB free, of which "
        "1.00 GB is kept free: free 13.1 GB or more and pull again"
    )


def test_the_reserve_and_other_running_pulls_count_as_taken():
    need = DiskNeed(need_bytes=4 * GB, files=1, have_bytes=0, free_bytes=4 * GB + GB // 2, where="/d")
    assert "of which 1.00 GB is kept free" in refusal("org/m", need)  # fits the disk, not beside the reserve
    assert refusal("org/m", need, reserve=0) is None
    others = DiskNeed(need_bytes=4 * GB, files=1, have_bytes=0, free_bytes=6 * GB, where="/d", reserved_bytes=2 * GB)
    assert "2.00 GB is promised to pulls running now" in refusal("org/m", others)


def test_what_an_interrupted_pull_left_is_not_needed_again():
    need = DiskNeed(need_bytes=GB, files=1, have_bytes=9 * GB, free_bytes=GB, where="/d")
    assert "it needs 1.00 GB more in 1 file (9.00 GB already downloaded)" in refusal("org/m", need)


def test_bytes_read_as_the_hub_shows_them():
    assert [format_bytes(n) for n in (0, 999, 3400, 12_500_000, 4_270_000_000, 15 * GB, None)] == [
        "0 B",
        "999 B",
        "3.40 kB",
        "12.5 MB",
        "4.27 GB",
        "15.0 GB",
        "?",
    ]
