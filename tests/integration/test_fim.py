"""Fill-in-the-middle on /v1/completions: a worker on a model whose tokenizer carries Qwen2.5-
Coder's FIM tokens (builtin:tiny's tokenizer with three unused special tokens renamed) reads the
form from its tokenizer and serves ``suffix`` in it: the prompt the model sees is that form's,
token for token, and the answer is the same as the form sent whole as a raw prompt (greedy).
(A model without FIM tokens answers 400 naming suffix: tests/integration/test_openai_api.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.support.models import fim_tiny
from tests.support.servers import start_serve


@pytest.fixture(scope="module")
def server():
    model = fim_tiny(Path(os.environ["VLLMMLXD_STATE_DIR"]) / "test-models" / "fim-tiny")
    s = start_serve(str(model), "--served-model-name", "coder", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def complete(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"max_tokens": 8, "temperature": 0, **body}, timeout=60)


def test_a_suffix_is_served_in_the_models_own_fim_form(server):
    prefix, suffix = "def add(a, b):\n    ", "\n    return total\n"
    filled = complete(server, prompt=prefix, suffix=suffix)
    assert filled.status_code == 200, filled.text
    form = f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    whole = complete(server, prompt=form)
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": form}).json()["tokens"]
    assert [t for t in tokens if t in (7, 8, 9)] == [7, 8, 9]  # the three control tokens, each one token
    assert filled.json()["usage"]["prompt_tokens"] == len(tokens) == whole.json()["usage"]["prompt_tokens"]
    assert filled.json()["choices"][0]["text"] == whole.json()["choices"][0]["text"]
    ids = complete(server, prompt=[1, 2, 3], suffix="x")
    assert ids.status_code == 400 and ids.json()["error"]["param"] == "suffix"
