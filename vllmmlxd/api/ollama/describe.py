"""What ``/api/show`` and ``/api/ps`` say of a worker's model, in Ollama's words. Pure, given the
facts the routes read (the entry's settings, the engine's ``ModelInfo``, the model folder's
``config.json`` and weights, the worker's idle time).

Ollama describes a model by its Modelfile; here the facts come from the entry and the model's
folder: the family (``model_type``), the quantization, the context length, the chat template,
the entry's sampling defaults as ``parameters``, and what it can do (``capabilities``).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from .encode import created_at

FOREVER = "2318-06-01T00:00:00Z"  # Ollama's expiry of a model kept loaded for ever
# The Ollama release whose API this follows (clients check /api/version before using newer fields).
OLLAMA_VERSION = "0.12.0"


@dataclass(frozen=True)
class Facts:
    """What the routes read of the entry and its model for a description."""

    name: str  # as clients see it
    source: str  # the model's folder (or repo id)
    context_length: int
    template: str | None  # the chat template's text
    family: str  # config.json's model_type ("" when unknown)
    quantization_bits: int | None  # config.json's quantization.bits
    size_bytes: int  # the weights on disk
    capabilities: tuple[str, ...]
    parameters: tuple[tuple[str, Any], ...]  # the entry's defaults, as Modelfile PARAMETER lines
    started: float  # when the worker started (wall clock)


def capabilities(*, generates: bool, tools: bool, thinking: bool, vision: bool, embeds: bool) -> tuple[str, ...]:
    """Ollama's capability names for what the entry serves."""
    named = (
        ("completion", generates),
        ("tools", generates and tools),
        ("thinking", generates and thinking),
        ("vision", generates and vision),
        ("embedding", embeds),
    )
    return tuple(name for name, has in named if has)


def digest(facts: Facts) -> str:
    """A stable id of what is served (Ollama's is its manifest's): the name and the model's source."""
    return hashlib.sha256(f"{facts.name}\n{facts.source}".encode()).hexdigest()


def details(facts: Facts) -> dict:
    quant = f"Q{facts.quantization_bits}" if facts.quantization_bits else ""
    return {
        "parent_model": "",
        "format": "mlx",
        "family": facts.family,
        "families": [facts.family] if facts.family else [],
        "parameter_size": "",
        "quantization_level": quant,
    }


def parameters_text(parameters: tuple[tuple[str, Any], ...]) -> str:
    """The defaults as Ollama's ``parameters``: one ``name value`` line each."""
    return "\n".join(f"{name:<16}{value}" for name, value in parameters)


def show_body(facts: Facts) -> dict:
    """``/api/show``'s answer."""
    family = facts.family or "unknown"
    return {
        "modelfile": f"# served by vllmmlxd from {facts.source}\nFROM {facts.source}\n",
        "parameters": parameters_text(facts.parameters),
        "template": facts.template or "",
        "details": details(facts),
        "model_info": {
            "general.architecture": family,
            "general.basename": facts.name,
            f"{family}.context_length": facts.context_length,
        },
        "capabilities": list(facts.capabilities),
        "modified_at": created_at(facts.started),
    }


def expires_at(idle_limit_s: float | None, idle_s: float, now: float | None = None) -> str:
    """When an idle model will be unloaded: its limit after its last request (``idle_s`` ago; 0 while
    one runs), or never (``idle_limit_s`` None)."""
    if idle_limit_s is None:
        return FOREVER
    now = time.time() if now is None else now
    return created_at(now + max(idle_limit_s - idle_s, 0.0))


def ps_line(facts: Facts, expires: str) -> dict:
    """This model's line of ``/api/ps``. Memory is unified on Apple silicon: all of it counts as VRAM."""
    return {
        "name": facts.name,
        "model": facts.name,
        "size": facts.size_bytes,
        "digest": digest(facts),
        "details": details(facts),
        "expires_at": expires,
        "size_vram": facts.size_bytes,
        "context_length": facts.context_length,
    }


def tag_entry(name: str, modified_at: str, *, size: int = 0, family: str = "", source: str = "") -> dict:
    """One model of ``/api/tags``: its name, when it was made available, its size if known."""
    return {
        "name": name,
        "model": name,
        "modified_at": modified_at,
        "size": size,
        "digest": hashlib.sha256(f"{name}\n{source}".encode()).hexdigest(),
        "details": {
            "parent_model": "",
            "format": "mlx",
            "family": family,
            "families": [family] if family else None,
            "parameter_size": "",
            "quantization_level": "",
        },
    }
