"""Which waiting requests join the batch this round, and why the others wait: a pure plan.

Oldest first, while there is room: a row free (``max_num_seqs``) and the request's KV within
the budget (``kv_budget``). One whose KV does not fit yet stops the queue there, so smaller
ones behind it never overtake it for good. One that shares a long start with a prompt being
prefilled waits for it, to reuse that prefill from the prefix cache. The scheduler carries
the plan out (``Scheduler._admit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cache.prefix_cache import common_prefix
from ..types import WaitingFor
from .kv_budget import KvBudget
from .sequence import Sequence

SHARED_PREFIX_WAIT = 64  # tokens in common with a prompt being prefilled that make a request wait for it


@dataclass
class Admission:
    join: list[tuple[Sequence, int]] = field(default_factory=list)  # each with the width it reserves
    refuse: list[Sequence] = field(default_factory=list)  # can never fit (the budget was lowered meanwhile)
    leaders: list[Sequence] = field(default_factory=list)  # prompts others wait for: cached once prefilled
    behind_prefix: set[int] = field(default_factory=set)  # ids of those waiting for them
    blocked: WaitingFor | None = None  # what stopped admission this round


def plan_admission(
    waiting: list[Sequence],
    admitted: list[Sequence],
    budget: KvBudget,
    max_running: int,
    *,
    share_prefixes: bool,
) -> Admission:
    """``admitted``: the sequences in the batch or staged (``share_prefixes``: a prefix cache is on)."""
    plan = Admission()
    widths = reserved_widths(budget, admitted)
    prefilling = [s for s in admitted if s.progress.first_token_at is None]
    rows = len(admitted)
    for seq in waiting:
        if rows >= max_running:
            plan.blocked = "max_num_seqs"
            break
        leader = shared_prefix_leader(seq, prefilling) if share_prefixes else None
        if leader is not None:
            plan.leaders.append(leader)
            plan.behind_prefix.add(id(seq))
            continue
        width = budget.width(len(seq.prompt), seq.request.sampling.max_tokens)
        verdict = budget.verdict(widths, width)
        if verdict == "waits":
            plan.blocked = "kv_budget"
            break
        if verdict == "never":
            plan.refuse.append(seq)
            continue
        plan.join.append((seq, width))
        widths.append(width)
        prefilling.append(seq)
        rows += 1
    return plan


def reserved_widths(budget: KvBudget, admitted: list[Sequence]) -> list[int]:
    """The widths (tokens) ``admitted`` sequences reserve: each prompt and its max_tokens."""
    return [budget.width(len(s.prompt), s.request.sampling.max_tokens) for s in admitted]


def shared_prefix_leader(seq: Sequence, prefilling: list[Sequence]) -> Sequence | None:
    """A sequence being prefilled that shares a long start with ``seq``, which should wait for it."""
    prompt = np.asarray(seq.prompt_key)
    for other in prefilling:
        if common_prefix(np.asarray(other.prompt_key), prompt) >= SHARED_PREFIX_WAIT:
            return other
    return None
