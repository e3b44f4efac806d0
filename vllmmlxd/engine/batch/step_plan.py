"""A step's plan, as a plain value: every change made to the batch since the last pass, in
order, and the pass itself (its prompt chunk).

Rank 0's scheduler makes each change through ``batch.Batch``, which records it; before the
pass the plan goes to a sharded entry's other ranks (``lockstep``), which execute it through
the same ``Batch`` calls (``distributed.follow.FollowerBatch.play``) on their share of the model. A single-process engine
records nothing. No mlx here: the wire form is JSON, checked on the way in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

Piece = tuple[int, int, int]  # a prefix-cache piece: its id, and the positions it holds (prefix_cache.py)


@dataclass(frozen=True)
class Join:
    """A row joins: its prompt's uncached ``tokens`` after ``cached`` tokens whose KV comes from
    the prefix cache's ``source`` pieces (none: prefilled elsewhere, or nothing cached)."""

    uid: int  # the generator's id for it (the same on every rank: rows join in the same order)
    tokens: tuple[int, ...]
    cached: int
    source: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Leave:
    """Rows leave the batch now; with ``keep`` their KV comes back (for the prefix cache)."""

    uids: tuple[int, ...]
    keep: bool


@dataclass(frozen=True)
class Extract:
    """A copy of these rows' KV (a prompt just prefilled that a waiting request wants); they run on."""

    uids: tuple[int, ...]


@dataclass(frozen=True)
class Finish:
    """Rows rank 0 ended on a stop token or string (the other ranks sample nothing, so they end
    a row on their own only at its ``max_tokens``)."""

    uids: tuple[int, ...]


@dataclass(frozen=True)
class Keep:
    """The prefix cache kept ``pieces`` of the KV that came back for ``uid`` (a leave, an extract,
    or a finish): the other ranks cut the same positions from their own share."""

    uid: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Drop:
    """The prefix cache dropped a piece (evicted, or made redundant)."""

    piece: int


Change = Join | Leave | Extract | Finish | Keep | Drop


@dataclass(frozen=True)
class StepPlan:
    changes: tuple[Change, ...]
    chunk: int | None  # the pass's prompt chunk (tokens); None: no pass (idle, or closing)


_TAGS: dict[str, type[Change]] = {
    "join": Join,
    "leave": Leave,
    "extract": Extract,
    "finish": Finish,
    "keep": Keep,
    "drop": Drop,
}
_TAG_OF = {cls: tag for tag, cls in _TAGS.items()}


def to_wire(plan: StepPlan) -> dict[str, Any]:
    """The plan as JSON-ready data: each change as its tag and its fields in order."""
    changes = [[_TAG_OF[type(c)], *(getattr(c, f.name) for f in dataclasses.fields(c))] for c in plan.changes]
    return {"changes": changes, "chunk": plan.chunk}


def from_wire(body: dict[str, Any]) -> StepPlan:
    """The plan ``to_wire`` made; ValueError for anything else (the ranks would disagree)."""
    try:
        changes = tuple(_change(raw) for raw in body["changes"])
        chunk = body["chunk"]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"not a step plan: {exc!r}") from None
    if chunk is not None and not isinstance(chunk, int):
        raise ValueError(f"not a step plan: chunk {chunk!r}")
    return StepPlan(changes, chunk)


def _change(raw: list[Any]) -> Change:
    tag, *values = raw
    cls = _TAGS.get(tag)
    if cls is None:
        raise ValueError(f"unknown change {tag!r}")
    fields = dataclasses.fields(cls)
    if len(values) != len(fields):
        raise ValueError(f"{tag}: {len(values)} fields, not {len(fields)}")
    return cls(*(_frozen(v) for v in values))


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
