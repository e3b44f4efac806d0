"""Ollama's model-store endpoints on the gateway, the pure part: who may use them, which names they
take, and a pull's status (the daemon's ``PullStatus``, as JSON) in Ollama's words.

``/api/pull`` and ``/api/delete`` write to this host's disk, so they take a caller who may use every
model (``Table.may_use_every``): anyone when no entry needs a key, as with Ollama, else a key allowed
every entry. Ollama's library names (``llama3.2:1b``) mean nothing on the Hugging Face hub, so a pull
takes what ``vllmmlxctl pull`` takes, a repo id or its URL, with Ollama's ``:tag`` as the revision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BadGateway, Conflict, Forbidden, InvalidRequest, NotFound, RequestError, Unauthorized
from ..store.sources import REVISION_RE
from .routing import Table

LATEST = "latest"  # Ollama's default tag: the repo's default branch here
ACCEPTED = (
    "a Hugging Face repo id (org/name, for instance mlx-community/Qwen3-0.6B-4bit), "
    "org/name:REVISION (a branch, tag or commit), or the repo's URL"
)
# What follows ':' in a GGUF repo's Ollama name (hf.co/org/name:Q4_K_M) picks a quantized file there.
GGUF_TAG_RE = re.compile(r"^(?:I?Q\d\w*|F16|F32|BF16)$", re.IGNORECASE)
# Ollama's own registry, by the first part of a name (registry.ollama.ai/library/llama3, library/llama3).
OLLAMA_REGISTRY = frozenset({"registry.ollama.ai", "ollama.com", "www.ollama.com", "library"})
RUNNING = {
    "queued": "waiting for other pulls to finish",
    "resolving": "pulling manifest",
    "verifying": "verifying sha256 digest",
    "installing": "writing manifest",
}


@dataclass(frozen=True)
class PullAsk:
    """What to ask the daemon to pull: a repo id or URL (it checks which), and the revision."""

    source: str
    revision: str | None = None


def require_store_rights(table: Table, key: str | None, what: str) -> None:
    """401 or 403 unless a caller presenting ``key`` may use every model (see the module)."""
    if table.may_use_every(key):
        return
    message = f"{what} writes to this host's disk: it takes a key that may use every model"
    if key is not None and any(table.may_use(r, key) for r in table.routes if not r.is_open):
        raise Forbidden(message, code="store_not_allowed")  # a valid key, limited to some models
    raise Unauthorized(message, code="invalid_api_key")


def _text(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest(f"model is required: {ACCEPTED}", param="model")
    return name.strip()


def served_name(name: object) -> str | None:
    """The name a pull gives, when it could be one the gateway serves (no ``/``: not a repo id), with a
    ``:latest`` tag dropped; else None."""
    if not isinstance(name, str) or "/" in name:
        return None
    return name.removesuffix(":" + LATEST) or None


def pull_ask(name: object) -> PullAsk:
    """What ``/api/pull``'s ``model`` asks for; a 400 saying what is accepted otherwise. A URL goes to the
    daemon as it is (it knows the hub's hosts and ``$HF_ENDPOINT``); ``org/name:tag`` is the repo at that
    revision, ``:latest`` its default branch."""
    text = _text(name)
    if "://" in text:
        return PullAsk(text)
    base, tag = text, None
    if ":" in text.rsplit("/", 1)[-1]:
        base, _, tag = text.rpartition(":")
    first = base.split("/", 1)[0].lower()
    if "/" not in base or first in OLLAMA_REGISTRY:
        raise InvalidRequest(
            f"{text!r} is a name in Ollama's library; vllmmlxd pulls MLX models from the Hugging Face hub: "
            f"give {ACCEPTED}",
            param="model",
        )
    if tag is None or tag == LATEST:
        return PullAsk(base)
    if GGUF_TAG_RE.match(tag):
        raise InvalidRequest(
            f"{tag!r} picks a GGUF file; vllmmlxd pulls MLX folders, whose quantization is in the repo's "
            f"name (mlx-community/...-4bit): give {ACCEPTED}",
            param="model",
        )
    if not REVISION_RE.match(tag):
        raise InvalidRequest(f"{tag!r} is not a branch, tag or commit name: give {ACCEPTED}", param="model")
    return PullAsk(base, tag)


# What a store name may be (as ``vllmmlxctl models`` lists it: org/name, or a folder's name): never
# a path of the control API (``../pulls/ID``), which the name goes into.
STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,95}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")


def store_name(name: object) -> str:
    """The store's name for what ``/api/delete`` names (as ``vllmmlxctl models`` lists it); a ``:latest``
    tag is dropped, and another tag is a 400: the store keeps one copy of a repo. A name that is no
    store name (a path, ``..``) is a 400."""
    text = _text(name).removesuffix(":" + LATEST)
    last = text.rsplit("/", 1)[-1]
    if "/" in text and ":" in last:
        repo = text.rpartition(":")[0]
        raise InvalidRequest(f"the store keeps one copy of each repo, whatever its revision: delete {repo}")
    if not STORE_NAME.fullmatch(text) or ".." in text:
        raise InvalidRequest(f"{text!r} is not a model of the store (org/name, as vllmmlxctl models lists it)")
    return text


def progress_line(status: dict) -> dict:
    """One pull status as the line Ollama's clients read: ``status``, and while downloading ``digest``
    (the commit), ``total`` and ``completed`` bytes; an ended pull's ``success``, or ``error``."""
    state = status.get("state")
    if state in RUNNING:
        return {"status": RUNNING[state]}
    if state == "downloading":
        line: dict = {"status": f"pulling {status.get('repo')}", "digest": status.get("commit")}
        line.update(total=status.get("total_bytes"), completed=status.get("done_bytes"))
        return {k: v for k, v in line.items() if v is not None}
    if state == "done":
        return {"status": "success"}
    return {"error": ended_error(status).message}


def progress_lines(status: dict) -> list[dict]:
    """The lines one status stands for: a finished pull says first where the model went (an entry
    naming it serves it), then ``success``, the line a client reads as the end."""
    line = progress_line(status)
    if status.get("state") == "done":
        repo = status.get("repo")
        return [{"status": f"{repo} is in the store: an entry with model: {repo} serves it"}, line]
    return [line]


def ended_error(status: dict) -> RequestError:
    """Why an ended pull did not bring its model, as the error ``stream: false`` answers: 404 when the hub
    has no such repo or revision, 400 when it was refused (not an MLX folder, not enough disk: the message
    has the numbers), 409 when it was cancelled, 502 when the hub or the download failed."""
    repo = status.get("repo")
    error = str(status.get("error") or "")
    if status.get("state") == "cancelled":
        return Conflict(f"the pull of {repo} was cancelled")
    if status.get("missing"):
        return NotFound(error or f"no model {repo} on the hub", code="model_not_found")
    if status.get("refused"):
        return InvalidRequest(error or f"{repo} cannot be pulled here", param="model")
    return BadGateway(error or f"the pull of {repo} failed")


def lost(repo: str) -> dict:
    """The last line when the daemon's answer broke off before the pull ended."""
    return {"error": f"the daemon stopped answering while {repo} was pulled: pull it again to see where it is"}
