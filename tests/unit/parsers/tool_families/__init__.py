"""Each tool-call family's cases for the contract every family's parser keeps
(test_tool_contract.py): one module per family, each defining ``FAMILY``."""

from __future__ import annotations

from tests.unit.parsers.tool_families import (
    auto,
    deepseek,
    functionary,
    glm47,
    granite,
    harmony,
    hermes,
    kimi,
    llama,
    mistral,
    nemotron,
    qwen,
    xlam,
)
from tests.unit.parsers.tool_families.spec import TOOLS, Family

__all__ = ["FAMILIES", "TOOLS", "Family"]

FAMILIES: dict[str, Family] = {
    module.FAMILY.name: module.FAMILY
    for module in (
        auto,
        deepseek,
        functionary,
        glm47,
        granite,
        harmony,
        hermes,
        kimi,
        llama,
        mistral,
        nemotron,
        qwen,
        xlam,
    )
}
