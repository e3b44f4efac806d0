"""Who is calling: keys from either header, digests compared in constant time, 401 vs 403,
and a client address that only a trusted proxy can name."""

from __future__ import annotations

import secrets

import pytest
from starlette.requests import Request

from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import Resolved, ResolvedModel
from vllmmlxd.errors import Forbidden, Unauthorized
from vllmmlxd.http import access

CONFIG = """
api_keys:
  alice: {key: alice-secret, models: ["*"]}
  ci: {key: ci-secret, models: [other]}
models:
  llama: {model: builtin:tiny, api_keys: [alice], api_key: own-secret}
  other: {model: builtin:tiny, port: 8001, api_keys: ["*"]}
  open: {model: builtin:tiny, port: 8002}
"""


def request(headers: dict[str, str] | None = None, client=("10.0.0.7", 5000)) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "headers": raw, "method": "GET", "path": "/", "client": client})


@pytest.fixture(scope="module")
def entries() -> dict[str, Resolved]:
    return parse_config(CONFIG).config.models


def test_either_header_carries_the_key():
    assert access.presented_key(request({"Authorization": "Bearer k1"})) == "k1"
    assert access.presented_key(request({"x-api-key": "k2"})) == "k2"
    assert access.presented_key(request({})) is None


def test_a_listed_key_and_the_entrys_own_key_get_in_by_name(entries):
    table = access.Access(entries["llama"])
    assert table.identify(request({"Authorization": "Bearer alice-secret"})).key_name == "alice"
    assert table.identify(request({"x-api-key": "own-secret"})).key_name == "api_key"
    assert table.identify(request({"x-api-key": "alice-secret"})).identity == "key:alice"


def test_an_unknown_key_is_401_and_a_known_key_not_listed_is_403(entries):
    table = access.Access(entries["llama"])
    for headers in ({}, {"x-api-key": "nope"}, {"Authorization": "Basic alice-secret"}):
        with pytest.raises(Unauthorized):
            table.identify(request(headers))
    with pytest.raises(Forbidden, match="'ci' may not use this model"):
        table.identify(request({"x-api-key": "ci-secret"}))


def test_a_star_entry_takes_every_key_whose_models_match(entries):
    table = access.Access(entries["other"])
    assert table.identify(request({"x-api-key": "ci-secret"})).key_name == "ci"
    assert table.identify(request({"x-api-key": "alice-secret"})).key_name == "alice"


def test_an_open_entry_asks_no_key_and_counts_by_address(entries):
    caller = access.Access(entries["open"]).identify(request({"x-api-key": "whatever"}))
    assert (caller.key, caller.identity) == (None, "addr:10.0.0.7")


def test_only_digests_reach_the_worker(entries):
    sent = entries["llama"].to_worker_json() + entries["other"].to_worker_json()
    for secret in ("alice-secret", "ci-secret", "own-secret"):
        assert secret not in sent
    assert "alice-secret" not in repr(parse_config(CONFIG).config)


def test_digests_are_compared_in_constant_time_against_every_grant(entries, monkeypatch):
    calls = []
    real = secrets.compare_digest
    monkeypatch.setattr(access.secrets, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    table = access.Access(entries["llama"])
    assert table.match("own-secret").name == "api_key"  # the first grant matches ...
    assert len(calls) == len(table.grants) == 3  # ... and every other grant is still compared
    assert table.match("wrong") is None


def test_forwarded_for_is_believed_only_from_a_trusted_proxy():
    spoofed = {"X-Forwarded-For": "1.2.3.4"}
    plain = access.Access(ResolvedModel(model="builtin:tiny"))
    assert plain.client_address(request(spoofed, client=("127.0.0.1", 1))) == "127.0.0.1"
    proxied = access.Access(ResolvedModel(model="builtin:tiny", trusted_proxies=["127.0.0.1", "10.0.0.0/8"]))
    assert proxied.client_address(request(spoofed, client=("127.0.0.1", 1))) == "1.2.3.4"
    # The client's own header comes first; the proxies append to the right of it.
    chain = {"X-Forwarded-For": "6.6.6.6, 5.5.5.5, 10.1.1.1"}
    assert proxied.client_address(request(chain, client=("127.0.0.1", 1))) == "5.5.5.5"
    assert proxied.client_address(request(spoofed, client=("192.168.1.9", 1))) == "192.168.1.9"


GATEWAY_CONFIG = """
gateway: {}
models:
  m: {model: builtin:tiny}
"""


def test_behind_a_gateway_only_the_daemons_token_names_the_client(monkeypatch):
    entry = parse_config(GATEWAY_CONFIG).config.models["m"]
    token = entry.gateway_token.get_secret_value()
    behind = access.Access(entry)
    # A local program talking to the worker's port is one client whatever it writes, loopback or not.
    forged = {"X-Forwarded-For": "1.2.3.4", access.GATEWAY_CLIENT_HEADER: "1.2.3.5"}
    assert behind.client_address(request(forged, client=("127.0.0.1", 1))) == "127.0.0.1"
    assert (
        behind.client_address(request({**forged, access.GATEWAY_TOKEN_HEADER: token + "x"}, client=("::1", 1))) == "::1"
    )
    # The gateway, with the token, says who its client is.
    assert (
        behind.client_address(request({**forged, access.GATEWAY_TOKEN_HEADER: token}, client=("127.0.0.1", 1)))
        == "1.2.3.5"
    )
    # Compared as digests in constant time.
    calls = []
    real = secrets.compare_digest
    monkeypatch.setattr(access.secrets, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    behind.client_address(request({access.GATEWAY_TOKEN_HEADER: "guess"}, client=("127.0.0.1", 1)))
    assert calls and all(len(a) == len(b) == 64 for a, b in calls)
    # A worker started by hand has no token: the header means nothing there.
    plain = access.Access(ResolvedModel(model="builtin:tiny"))
    assert (
        plain.client_address(request({access.GATEWAY_TOKEN_HEADER: "", **forged}, client=("127.0.0.1", 1)))
        == "127.0.0.1"
    )
