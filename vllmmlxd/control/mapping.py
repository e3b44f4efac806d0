"""The supervisor's plain answers as the control API's wire models.

The supervisor returns dataclasses and knows nothing of the wire; this is the one place
that shapes them for ``vllmmlxctl`` (read by attribute, so nothing here imports the supervisor).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllmmlxd.control.protocol import (
    ActionResponse,
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
)


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
