"""Each tool-call family's cases for the contract every family's parser keeps
(test_tool_contract.py): one module per family, each defining ``FAMILY``."""

from __future__ import annotations

import importlib

from tests.unit.parsers.tool_families.spec import TOOLS, Family

__all__ = ["FAMILIES", "TOOLS", "Family"]

_MODULES = (
    "auto",
    "deepseek",
    "functionary",
    "glm47",
    "granite",
    "harmony",
    "hermes",
    "kimi",
    "llama",
    "mistral",
    "nemotron",
    "qwen",
    "xlam",
)
FAMILIES: dict[str, Family] = {
    family.name: family for family in (importlib.import_module(f"{__name__}.{m}").FAMILY for m in _MODULES)
}
