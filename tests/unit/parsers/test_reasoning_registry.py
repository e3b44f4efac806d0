"""make_reasoning_parser: families found by name, and the package's imports kept pure."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import vllmmlxd.parsers.reasoning as reasoning
from vllmmlxd.parsers.reasoning import REASONING_PARSERS, ReasoningParser, make_reasoning_parser


@pytest.mark.parametrize("name", REASONING_PARSERS)
def test_every_name_makes_a_fresh_parser(name):
    a, b = make_reasoning_parser(name, "<think>\n"), make_reasoning_parser(name, "<think>\n")
    assert isinstance(a, ReasoningParser) and a is not b


def test_the_names_are_the_family_modules():
    modules = {m.name for m in pkgutil.iter_modules(reasoning.__path__)} - {"base"}
    assert set(REASONING_PARSERS) == modules


@pytest.mark.parametrize("name", ["llama", "base", "", "qwen3.base", "QWEN3"])
def test_an_unknown_name_lists_the_known_ones(name):
    with pytest.raises(ValueError, match="known: deepseek_r1, qwen3"):
        make_reasoning_parser(name, "")


def test_the_parsers_import_nothing_outside_parsers():
    code = (
        "import sys, vllmmlxd.parsers.reasoning as r\n"
        "[r.make_reasoning_parser(n, '') for n in r.REASONING_PARSERS]\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    ours = [m for m in loaded if m.startswith("vllmmlxd.") and not m.startswith("vllmmlxd.parsers")]
    foreign = [m for m in loaded if m.split(".")[0] in {"mlx", "mlx_lm", "fastapi", "starlette", "pydantic"}]
    assert ours == [] and foreign == []
