"""The version is written in one place (vllmmlxd/__init__.py) and reported with the clone's commit."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

from vllmmlxd import __version__
from vllmmlxd.version import ROOT, commit, describe


def test_the_package_metadata_reads_the_one_version():
    assert importlib.metadata.version("vllmmlxd") == __version__
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()


def test_both_commands_print_the_version_and_the_clone_s_commit():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    assert commit() is not None and commit().startswith(head.stdout.strip())
    for module, prog in (("vllmmlxd.cli", "vllmmlxd"), ("vllmmlxd.ctl", "vllmmlxctl")):
        out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"{prog} {describe()}"
        assert re.fullmatch(rf"{prog} {re.escape(__version__)} \(commit [0-9a-f]{{12}}(\+dirty)?\)", out.stdout.strip())


def test_the_changelog_has_this_version():
    assert f"## {__version__}" in (ROOT / "CHANGELOG.md").read_text()
