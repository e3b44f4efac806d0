"""The bodies the fuzzers found answered with a 500, each now a 4xx (or served) on a real worker."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fuzz.worker import AUTH, assert_alive, assert_error_shape, start_worker

HI = '"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'


def deep_object(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def tool_call_history(arguments: str) -> str:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}], "max_tokens": 2}
    )


@pytest.fixture(scope="module")
def worker():
    s = start_worker()
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.mark.parametrize(
    "path,body,statuses",
    [
        # The parser's own failures beyond bad syntax: nesting past its stack, a number past 4300 digits.
        ("/v1/chat/completions", "[" * 100_000 + "]" * 100_000, {422}),
        ("/v1/messages", '{{{}, "x": {}}}'.format(HI, "[" * 100_000 + "]" * 100_000), {400}),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1%s}' % ("0" * 5000),
            {422},
        ),
        # A lone surrogate escape: no Unicode text, refused before a tokenizer sees it.
        ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', {422}),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}', {422}),
        ("/v1/messages/count_tokens", '{"messages": [{"role": "user", "content": "\\ud800"}]}', {400}),
        # A surrogate pair is one character, and fine.
        ("/v1/completions", '{"prompt": "a\\ud83d\\ude00b", "max_tokens": 2}', {200}),
        # An empty prompt in its list form: the engine cannot start from no tokens.
        ("/v1/completions", '{"prompt": [""], "max_tokens": 2}', {400}),
        # A schema nested far deeper than the structured-output limit: its depth check no longer recurses.
        (
            "/v1/chat/completions",
            f'{{{HI}, "response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {deep_object(500)}}}}}}}',
            {400},
        ),
        (
            "/v1/messages",
            f'{{{HI}, "output_format": {{"type": "json_schema", "schema": {deep_object(500)}}}}}',
            {400},
        ),
        # Tool-call arguments sent back as text the JSON parser refuses past its syntax: kept as text.
        ("/v1/chat/completions", tool_call_history("[" * 5000 + "]" * 5000), {200, 400}),
        ("/v1/chat/completions", tool_call_history("1" + "0" * 5000), {200, 400}),
    ],
)
def test_a_body_that_was_a_500_is_answered_in_its_family_shape(worker, path, body, statuses):
    r = httpx.post(
        worker.url + path, content=body.encode(), headers={**AUTH, "content-type": "application/json"}, timeout=60
    )
    assert r.status_code in statuses, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert_error_shape(path, r.json())
    assert_alive(worker)
    assert "event=request.failed" not in worker.log(), worker.log()[-2000:]
