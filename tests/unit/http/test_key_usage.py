"""A worker's side of usage per key (http/key_usage.py): what counts as use, what a request used,
the budget check, and the per-key counters."""

from __future__ import annotations

import time

import pytest

from vllmmlxd.config.keys import KeyBudget, KeyGrant
from vllmmlxd.errors import BudgetExceeded
from vllmmlxd.http.access import Caller
from vllmmlxd.http.access_log import SERVED
from vllmmlxd.http.key_usage import KeyUsageCollector, check_budget, counted, recorder, used
from vllmmlxd.usage import Counts, Ledger

DIGEST = "0" * 64


def caller(budget: KeyBudget | None = None) -> Caller:
    grant = KeyGrant(name="alice", sha256=DIGEST, allowed=True, budget=budget or KeyBudget())
    return Caller(identity="key:alice", key=grant)


def test_work_asked_of_the_model_counts_and_reads_do_not():
    assert counted("POST", "/v1/chat/completions") and counted("POST", "/ollama/api/chat")
    assert not counted("GET", "/v1/models") and not counted("GET", "/v1/status")
    assert not counted("POST", "/v1/messages/count_tokens") and not counted("POST", "/ollama/api/show")
    assert not counted("POST", "/tokenize")


def test_a_request_uses_what_its_usage_said():
    state = {SERVED: {"prompt_tokens": 12, "cached_tokens": 8, "completion_tokens": 5, "ttft_s": 0.1}}
    assert used(state, 200) == Counts(requests=1, input_tokens=12, cached_tokens=8, output_tokens=5)
    assert used({}, 400) == Counts(requests=1, errors=1)


def test_a_spent_budget_is_a_429_naming_it_and_other_keys_pass(tmp_path):
    ledger = Ledger(tmp_path / "usage.sqlite3")
    try:
        record = recorder(ledger, lambda: "qwen")
        limited = caller(KeyBudget(tokens_per_day=10))
        check_budget(ledger, limited, "POST", "/v1/chat/completions", time.time())
        record({"caller": limited, SERVED: {"prompt_tokens": 6, "completion_tokens": 4}}, "POST", "/v1/chat", 200)
        record({"caller": limited}, "GET", "/v1/models", 200)  # not use
        with pytest.raises(BudgetExceeded) as refused:
            check_budget(ledger, limited, "POST", "/v1/responses", time.time())
        assert refused.value.status_code == 429 and refused.value.code == "budget_exceeded"
        assert "10 tokens per day (10 used)" in refused.value.message and refused.value.retry_after > 0
        check_budget(ledger, limited, "POST", "/tokenize", time.time())  # a read is not refused
        check_budget(ledger, caller(), "POST", "/v1/chat/completions", time.time())  # no budget: never
        metrics = {m.name: m for m in KeyUsageCollector(ledger, lambda: "qwen").collect()}
        [sample] = metrics["vllmmlxd_key_output_tokens"].samples
        assert sample.labels == {"model": "qwen", "key": "alice"} and sample.value == 4
        assert metrics["vllmmlxd_key_requests"].samples[0].value == 1
    finally:
        ledger.close()
