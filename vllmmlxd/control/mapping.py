"""The supervisor's plain answers as the control API's wire models.

The supervisor returns dataclasses and knows nothing of the wire; this is the one place
that shapes them for ``vllmmlxctl`` (read by attribute, so nothing here imports the supervisor).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vllmmlxd import usage
from vllmmlxd.control.protocol import (
    ActionResponse,
    BudgetStatus,
    DaemonStatus,
    GatewayStatus,
    GroupStatus,
    ModelStatus,
    PullStatus,
    ReloadResponse,
    ReloadResult,
    StatusResponse,
    StoredModelStatus,
    StoreResponse,
    UsageResponse,
    UsageRow,
)
from vllmmlxd.usage import Budget


def _fields(view: Any) -> dict:
    is_instance = dataclasses.is_dataclass(view) and not isinstance(view, type)
    return dataclasses.asdict(view) if is_instance else dict(vars(view))


def status_response(view: Any) -> StatusResponse:
    """A ``StatusView``: the daemon, and each model with its worker's runtime figures flattened in."""
    daemon = _fields(view.daemon)
    models = []
    for model in view.models:
        fields = _fields(model)
        runtime = fields.pop("runtime", None) or {}
        models.append(ModelStatus(**fields, **runtime))
    gateway = getattr(view, "gateway", None)
    return StatusResponse(
        daemon=DaemonStatus(**daemon),
        models=models,
        gateway=GatewayStatus(**_fields(gateway)) if gateway is not None else None,
        groups=[GroupStatus(**_fields(g)) for g in getattr(view, "groups", None) or ()],
        pulls=[pull_status(p) for p in getattr(view, "pulls", None) or ()],
    )


def reload_result(record: Any | None) -> ReloadResult | None:
    return None if record is None else ReloadResult(**_fields(record))


def reload_response(reply: Any) -> ReloadResponse:
    return ReloadResponse(**_fields(reply))


def action_response(reply: Any) -> ActionResponse:
    return ActionResponse(**_fields(reply))


def pull_status(view: Any) -> PullStatus:
    """A store ``PullView`` as the wire's ``PullStatus``."""
    return PullStatus(**_fields(view))


def store_response(path: str, free_bytes: int | None, models: Any, pulls: Any) -> StoreResponse:
    """The store's ``StoredModel`` list and its running pulls' views."""
    return StoreResponse(
        path=path,
        free_bytes=free_bytes,
        models=[StoredModelStatus(**_fields(m)) for m in models],
        pulls=[pull_status(p) for p in pulls],
    )


def usage_response(path: Path, since_s: float, budgets: dict[str, Budget], now: float) -> UsageResponse:
    """What ``usage.sqlite3`` holds for the last ``since_s`` seconds, and each budgeted key's state
    (read on a thread: the file may be busy for a moment while workers write)."""
    db = usage.connect(path)
    try:
        rows = [
            UsageRow(key=key, model=model, **counts.as_dict())
            for (key, model), counts in sorted(usage.totals(db, since=now - since_s).items())
        ]
        states = []
        day, month = usage.period_starts(now)
        for key, budget in sorted(budgets.items()):
            if not budget.limited:
                continue
            spent = usage.spent_from(db, key, now)
            states.append(
                BudgetStatus(
                    key=key,
                    tokens_per_day=budget.tokens_per_day,
                    tokens_per_month=budget.tokens_per_month,
                    requests_per_day=budget.requests_per_day,
                    day_tokens=spent.day.tokens,
                    month_tokens=spent.month.tokens,
                    day_requests=spent.day.requests,
                    left=usage.left(budget, spent),
                    day_resets=usage.next_day(day).isoformat(timespec="seconds"),
                    month_resets=usage.next_month(month).isoformat(timespec="seconds"),
                )
            )
    finally:
        db.close()
    return UsageResponse(since_s=since_s, rows=rows, budgets=states)
