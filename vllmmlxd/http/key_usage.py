"""A worker's side of usage per key (``vllmmlxd/usage.py``): what a finished request used, the
budget check before a request starts, and the per-key counters in ``/metrics``.

A request counts when it asks the model for work: a ``POST`` to an API route, answered or
refused (a 4xx or 5xx counts as an error too); reads (``GET /v1/models``, ``/v1/status``) and
the tokenizer's and token counting's routes do not. Its tokens are what its ``usage`` says
(the access log's numbers: ``SERVED``), so the counts equal the sum of what clients were told.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from ..errors import BudgetExceeded
from ..usage import OPEN_KEY, Counts, Ledger, overrun
from .access import Caller
from .access_log import SERVED

# POST routes that read (count tokens, tokenize, describe a model): no work asked of the engine.
NOT_WORK = ("/tokenize", "/detokenize", "/v1/messages/count_tokens", "/api/show")


def counted(method: str, path: str) -> bool:
    """Whether a request to ``path`` is use of the model (module docstring)."""
    return method == "POST" and not path.endswith(NOT_WORK)


def used(state: dict[str, Any], status: int) -> Counts:
    """What one answered request used, from what the API layer left in its state."""
    served = state.get(SERVED)
    served = served if isinstance(served, dict) else {}
    return Counts(
        requests=1,
        errors=int(status >= 400),
        input_tokens=int(served.get("prompt_tokens") or 0),
        cached_tokens=int(served.get("cached_tokens") or 0),
        output_tokens=int(served.get("completion_tokens") or 0),
    )


def recorder(ledger: Ledger, model: Callable[[], str]) -> Callable[[dict[str, Any], str, str, int], None]:
    """The access log's hook: record a counted request's use under its key's name."""

    def record(state: dict[str, Any], method: str, path: str, status: int) -> None:
        caller = state.get("caller")
        if isinstance(caller, Caller) and counted(method, path):
            ledger.record(caller.key_name or OPEN_KEY, model(), used(state, status))

    return record


def check_budget(ledger: Ledger, caller: Caller, method: str, path: str, now: float) -> None:
    """``BudgetExceeded`` when the caller's key has used up a budget (a counted request only)."""
    grant = caller.key
    if grant is None or not counted(method, path):
        return
    budget = grant.budget.plain()
    if not budget.limited:
        return
    over = overrun(budget, ledger.spent(grant.name), now)
    if over is not None:
        raise BudgetExceeded(over.message(grant.name), retry_after=over.retry_after(now))


# (metric, help, Counts field): per key and model, since the worker started.
KEY_COUNTERS = (
    ("vllmmlxd_key_requests", "Requests of each key (use of the model, answered or refused).", "requests"),
    ("vllmmlxd_key_errors", "Requests of each key answered with an error.", "errors"),
    ("vllmmlxd_key_input_tokens", "Prompt tokens of each key's requests, cached ones included.", "input_tokens"),
    (
        "vllmmlxd_key_cached_tokens",
        "Prompt tokens of each key's requests served from the prefix cache.",
        "cached_tokens",
    ),
    ("vllmmlxd_key_output_tokens", "Tokens generated for each key.", "output_tokens"),
)


class KeyUsageCollector:
    """``vllmmlxd_key_*_total{model, key}`` from this worker's ledger (key names come from the
    config, so the labels are bounded; an open entry's requests have ``key=""``)."""

    def __init__(self, ledger: Ledger, model: Callable[[], str]):
        self._ledger, self._model = ledger, model

    def collect(self) -> Iterator[Metric]:
        served = self._model()
        rows = self._ledger.snapshot()
        for name, doc, field in KEY_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["model", "key"])
            for (key, _), counts in rows.items():
                family.add_metric([served, key], getattr(counts, field))
            yield family

    def describe(self) -> Iterator[Metric]:
        for name, doc, _ in KEY_COUNTERS:
            yield CounterMetricFamily(name, doc, labels=["model", "key"])
