"""Hosted tools: the tools a provider runs on its own side (OpenAI's ``web_search``,
``code_interpreter``…, Anthropic's ``web_search_20250305``…), which a request may name and this
server cannot run. Agents send them unasked (Codex sends ``web_search`` by default), so by
default they are left out of what the model sees and named back in a response header; an entry
with ``hosted_tools: refuse`` answers them with a 400 naming the tool. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidRequest

HEADER = "x-vllmmlxd-ignored-tools"


@dataclass(frozen=True)
class HostedTool:
    """One hosted tool a request named: its type as sent, and the field that names it (``tools[2].type``)."""

    kind: str
    param: str


def enforce(policy: str, hosted: Iterable[HostedTool]) -> None:
    """``refuse``: the first hosted tool is a 400 naming it; ``ignore``: nothing to do here."""
    if policy != "refuse":
        return
    for tool in hosted:
        raise InvalidRequest(
            f"{tool.param}: the {tool.kind} tool runs at the provider and this server does not run it "
            "(hosted_tools: refuse); use function tools, or the entry's MCP servers as the worker's own tools",
            param=tool.param,
        )


def header_value(hosted: Iterable[HostedTool]) -> str:
    """The ignored tools' types, each once, in the order the request named them."""
    return ",".join(dict.fromkeys(tool.kind for tool in hosted))
