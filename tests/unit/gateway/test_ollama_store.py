"""Ollama's store endpoints on the gateway, pure parts: the names a pull and a delete take, who may
pull or delete, and a pull's statuses as Ollama's progress lines and errors."""

import pytest

from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.config.keys import KeyGrant, key_digest
from vllmmlxd.errors import BadGateway, Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from vllmmlxd.gateway.ollama_store import (
    PullAsk,
    ended_error,
    progress_line,
    progress_lines,
    pull_ask,
    require_store_rights,
    served_name,
    store_name,
)
from vllmmlxd.gateway.routing import build_table

COMMIT = "c" * 40


def route(name, grants=()):
    keyed = {"api_keys": tuple(g.name for g in grants), "key_grants": grants} if grants else {}
    return Route(name=name, served_model_name=name, url=f"http://127.0.0.1:1/{name}", **keyed)


def grant(name, allowed):
    return KeyGrant(name=name, sha256=key_digest(name + "-key"), allowed=allowed)


@pytest.mark.parametrize(
    "name, ask",
    [
        ("mlx-community/Qwen3-0.6B-4bit", PullAsk("mlx-community/Qwen3-0.6B-4bit")),
        ("  org/m  ", PullAsk("org/m")),
        ("org/m:latest", PullAsk("org/m")),
        ("org/m:v1.2", PullAsk("org/m", "v1.2")),
        ("org/m:" + COMMIT, PullAsk("org/m", COMMIT)),
        ("hf.co/org/m", PullAsk("hf.co/org/m")),  # as Ollama's users write hub repos
        ("hf.co/org/m:main", PullAsk("hf.co/org/m", "main")),
        ("https://huggingface.co/org/m/tree/v2", PullAsk("https://huggingface.co/org/m/tree/v2")),
        ("http://127.0.0.1:9000/org/m", PullAsk("http://127.0.0.1:9000/org/m")),  # a port is no tag
    ],
)
def test_a_pull_takes_repo_ids_with_a_tag_as_the_revision_and_urls_as_they_are(name, ask):
    assert pull_ask(name) == ask


@pytest.mark.parametrize(
    "name, says",
    [
        ("llama3.2:1b", "'llama3.2:1b' is a name in Ollama's library; vllmmlxd pulls MLX models from the Hugging Face"),
        ("tinyllama", "is a name in Ollama's library"),
        ("library/llama3", "is a name in Ollama's library"),
        ("registry.ollama.ai/library/llama3:8b", "is a name in Ollama's library"),
        ("hf.co/org/m-GGUF:Q4_K_M", "'Q4_K_M' picks a GGUF file; vllmmlxd pulls MLX folders"),
        ("org/m:bf16", "'bf16' picks a GGUF file"),
        ("org/m:", "'' is not a branch, tag or commit name"),
        ("org/m:-x", "'-x' is not a branch, tag or commit name"),
        ("", "model is required"),
        (None, "model is required"),
        (7, "model is required"),
    ],
)
def test_other_names_are_a_400_saying_what_is_accepted(name, says):
    with pytest.raises(InvalidRequest) as refused:
        pull_ask(name)
    assert says in refused.value.message
    assert "org/name:REVISION" in refused.value.message and refused.value.status_code == 400


def test_a_name_without_a_slash_may_be_one_the_gateway_serves():
    assert served_name("tiny") == "tiny" and served_name("tiny:latest") == "tiny"
    assert served_name("org/m") is None and served_name(None) is None and served_name(":latest") is None


def test_a_delete_names_what_the_store_lists_without_a_tag():
    assert store_name("org/m") == "org/m" and store_name("org/m:latest") == "org/m"
    assert store_name("builtin:tiny") == "builtin:tiny" and store_name("builtin:tiny:latest") == "builtin:tiny"
    assert store_name("gguf-1a2b3c") == "gguf-1a2b3c"
    with pytest.raises(
        InvalidRequest, match="the store keeps one copy of each repo, whatever its revision: delete org/m"
    ):
        store_name("org/m:v2")


@pytest.mark.parametrize("name", ["../pulls/abc", "org/../../pulls/abc", "/etc", "org/m/extra", "a b", "org/.."])
def test_a_delete_of_something_that_is_no_store_name_is_refused_before_the_control_api(name):
    # {"model": "../pulls/ID"} went into the control API's path and cancelled a pull (issue 37).
    with pytest.raises(InvalidRequest, match="is not a model of the store"):
        store_name(name)


def test_an_open_config_lets_anyone_pull_and_a_keyed_one_only_a_key_for_every_model():
    require_store_rights(build_table(GatewaySpec(routes=(route("a"), route("b")))), None, "pulling a model")
    require_store_rights(build_table(GatewaySpec()), None, "pulling a model")  # no models yet
    every, some = grant("every", True), grant("some", True)
    keyed = build_table(GatewaySpec(routes=(route("a", (every, some)), route("b", (every, grant("some", False))))))
    require_store_rights(keyed, "every-key", "pulling a model")
    with pytest.raises(
        Forbidden, match="pulling a model writes to this host's disk: it takes a key that may use every"
    ):
        require_store_rights(keyed, "some-key", "pulling a model")
    for key in (None, "nobody-key"):
        with pytest.raises(Unauthorized, match="deleting a model writes to this host's disk"):
            require_store_rights(keyed, key, "deleting a model")
    # An open entry beside keyed ones does not open the store.
    mixed = build_table(GatewaySpec(routes=(route("a"), route("b", (some,)))))
    with pytest.raises(Unauthorized):
        require_store_rights(mixed, None, "pulling a model")
    require_store_rights(mixed, "some-key", "pulling a model")


def status(state, **kw):
    return {"id": "1-abc", "repo": "org/m", "revision": None, "state": state, **kw}


def test_a_pulls_statuses_become_ollamas_progress_lines():
    assert progress_line(status("resolving")) == {"status": "pulling manifest"}
    downloading = status("downloading", commit=COMMIT, total_bytes=4000, done_bytes=1000, percent=25.0)
    assert progress_line(downloading) == {"status": "pulling org/m", "digest": COMMIT, "total": 4000, "completed": 1000}
    assert progress_line(status("downloading", done_bytes=0)) == {"status": "pulling org/m", "completed": 0}
    assert progress_line(status("verifying")) == {"status": "verifying sha256 digest"}
    assert progress_line(status("installing")) == {"status": "writing manifest"}
    assert progress_line(status("done", path="/s/models/hub-org--m")) == {"status": "success"}
    assert progress_lines(status("done")) == [
        {"status": "org/m is in the store: an entry with model: org/m serves it"},
        {"status": "success"},
    ]
    assert progress_lines(status("failed", error="boom")) == [{"error": "boom"}]
    assert progress_line(status("cancelled", error="cancelled")) == {"error": "the pull of org/m was cancelled"}


@pytest.mark.parametrize(
    "ended, kind, code, says",
    [
        (status("failed", error="no model org/m on H", missing=True), NotFound, 404, "no model org/m on H"),
        (status("failed", error="org/m is not an MLX model folder", refused=True), InvalidRequest, 400, "not an MLX"),
        (status("failed", error="not enough disk space", refused=True), InvalidRequest, 400, "not enough disk"),
        (status("failed", error="checksum mismatch in org/m"), BadGateway, 502, "checksum mismatch"),
        (status("failed", error="cannot reach H: ConnectError"), BadGateway, 502, "cannot reach H"),
        (status("failed"), BadGateway, 502, "the pull of org/m failed"),
        (status("cancelled", error="cancelled"), Conflict, 409, "the pull of org/m was cancelled"),
    ],
)
def test_an_ended_pulls_error_says_whose_fault_by_its_status(ended, kind, code, says):
    error = ended_error(ended)
    assert type(error) is kind and error.status_code == code and says in error.message
