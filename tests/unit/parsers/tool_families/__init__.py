"""Each tool-call family's cases for the contract every family's parser keeps
(test_tool_contract.py): one module per family of the parsers' registry, named as the family,
each defining ``FAMILY``."""

from __future__ import annotations

import importlib

from tests.unit.parsers.tool_families.spec import TOOLS, Family
from vllmmlxd.parsers.tools import TOOL_PARSERS

__all__ = ["FAMILIES", "TOOLS", "Family"]

FAMILIES: dict[str, Family] = {
    family.name: family for family in (importlib.import_module(f"{__name__}.{m}").FAMILY for m in TOOL_PARSERS)
}
