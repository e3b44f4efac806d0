"""Ollama's /api/pull, /api/delete and the refused store endpoints on the gateway's Ollama app, driven by
the official ``ollama`` client, against the real control server over a Unix socket with a scripted
store behind it (tests/support/control.py): the lines a pull streams, ``stream: false``, the names
taken and refused, the daemon's refusals in Ollama's shape, who may pull or delete. The real daemon,
hub and worker are tests/e2e/test_ollama_pull.py's."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import httpx
import ollama
import pytest

from tests.support.control import ControlThread, FakeTarget, pull_status, short_tmp_dir
from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.config.keys import KeyGrant, key_digest
from vllmmlxd.gateway.dispatch import Gateway
from vllmmlxd.gateway.ollama import create_ollama_app
from vllmmlxd.gateway.routing import build_table

HOST = "http://127.0.0.1:11434"
COMMIT = "c" * 40


def route(name: str, grants: tuple[KeyGrant, ...] = ()) -> dict:
    keyed = {"api_keys": [g.name for g in grants], "key_grants": grants} if grants else {}
    return dict(name=name, served_model_name=name, url=f"http://127.0.0.1:1/{name}", state="ready", **keyed)


@pytest.fixture
def target():
    return FakeTarget()


@pytest.fixture
def socket_path(target):
    with short_tmp_dir() as d, ControlThread(target, d / "ctl.sock"):
        yield str(d / "ctl.sock")


def run(check, socket_path: str | None, routes=None, headers=None):
    """``check(client)`` against the Ollama app of a gateway whose daemon listens on ``socket_path``."""
    routes = routes if routes is not None else (route("a"),)

    async def main():
        spec = GatewaySpec(routes=tuple(Route(**r) for r in routes), control_socket=socket_path)
        app = create_ollama_app(Gateway(build_table(spec)))
        transport = httpx.ASGITransport(app=app)
        await check(ollama.AsyncClient(host=HOST, transport=transport, headers=headers or {}))

    asyncio.run(main())


@asynccontextmanager
async def refused(status_code: int, says: str):
    with pytest.raises(ollama.ResponseError) as error:
        yield
    assert error.value.status_code == status_code and says in error.value.error, error.value


def test_a_pull_streams_ollamas_progress_lines_then_success(socket_path, target):
    async def check(client):
        lines = [p async for p in await client.pull("org/m", stream=True)]
        assert [p.status for p in lines] == [
            "pulling manifest",
            "pulling org/m",
            "pulling org/m",
            "org/m is in the store: an entry with model: org/m serves it",
            "success",
        ]
        assert [(p.digest, p.total, p.completed) for p in lines[1:3]] == [
            (COMMIT, 4_000_000_000, 1_000_000_000),
            (COMMIT, 4_000_000_000, 4_000_000_000),
        ]
        whole = await client.pull("org/m:v2")  # stream: false waits for the end and answers its last line
        assert whole.status == "success" and whole.completed is None

    run(check, socket_path)
    assert [c for c in target.calls if c[0] == "pull"] == [("pull", "org/m", None), ("pull", "org/m", "v2")]


def test_a_failed_pull_is_ollamas_error_with_a_status_saying_whose_fault(socket_path, target):
    missing = "no model org/m on http://hub (a private one needs HF_TOKEN set for the daemon)"

    async def check(client):
        target.pull_script = [pull_status("resolving"), pull_status("failed", error=missing, missing=True)]
        async with refused(404, missing):
            await client.pull("org/m")
        with pytest.raises(ollama.ResponseError) as streamed:  # after the head: a last line {"error": ...}
            [p.status async for p in await client.pull("org/m", stream=True)]
        assert streamed.value.error == missing
        target.pull_script = [pull_status("failed", error="org/m is not an MLX model folder", refused=True)]
        async with refused(400, "not an MLX model folder"):
            await client.pull("org/m")
        target.pull_script = [pull_status("failed", error="checksum mismatch in org/m: ...")]
        async with refused(502, "checksum mismatch in org/m"):
            await client.pull("org/m")
        target.pull_script = [pull_status("cancelled", error="cancelled")]
        async with refused(409, "the pull of org/m was cancelled"):
            await client.pull("org/m")
        target.pull_script = [pull_status("resolving")]  # the daemon's answer breaks off before the end
        with pytest.raises(ollama.ResponseError, match="the daemon stopped answering while org/m was pulled"):
            [p async for p in await client.pull("org/m", stream=True)]
        async with refused(503, "the daemon stopped answering while org/m was pulled"):
            await client.pull("org/m")

    run(check, socket_path)


def test_names_and_refusals_before_a_pull_starts(socket_path, target):
    async def check(client):
        async with refused(400, "'llama3.2:1b' is a name in Ollama's library"):  # before the head: its status
            [p async for p in await client.pull("llama3.2:1b", stream=True)]
        async with refused(400, "is not a Hugging Face model repo id"):  # the daemon's words (422)
            await client.pull("a/b/c")
        target.pull_conflict = "org/m@v1 is being pulled (p0): wait for it, or cancel it"
        async with refused(409, "org/m@v1 is being pulled"):
            await client.pull("org/m")
        # A name the config serves: nothing to download, said as a finished pull.
        served = [p.status async for p in await client.pull("a:latest", stream=True)]
        assert served == ["a is served here (an entry of the config)", "success"]

    run(check, socket_path)
    assert [c for c in target.calls if c[0] == "pull"] == [("pull", "org/m", None)]  # a/b/c: refused by its parse


def test_delete_removes_a_download_and_is_refused_while_in_use(socket_path, target):
    async def check(client):
        assert (await client.delete("org/m:latest")).status == "success"
        async with refused(409, "builtin:tiny is in use by a"):
            await client.delete("builtin:tiny")
        async with refused(404, "no model 'nope' in the store"):
            await client.delete("nope")
        async with refused(404, "a is a model of the config, not a download: remove its entry"):
            await client.delete("a")
        async with refused(400, "the store keeps one copy of each repo"):
            await client.delete("org/m:v2")

    run(check, socket_path)
    assert [c for c in target.calls if c[0] == "remove"] == [
        ("remove", n) for n in ("org/m", "builtin:tiny", "nope", "a")
    ]
    assert [m.name for m in target.stored] == ["builtin:tiny"]


def test_copy_create_and_push_are_refused_saying_why(socket_path):
    async def check(client):
        async with refused(501, "a copy under a new name is an alias (aliases: [NEW] on the entry"):
            await client.copy("a", "b")
        async with refused(501, "vllmmlxd makes no models"):
            await client.create("b", from_="a")
        async with refused(501, "vllmmlxd does not publish models"):
            await client.push("a")

    run(check, socket_path)


def test_with_keys_only_a_key_for_every_model_pulls_or_deletes(socket_path, target):
    every = KeyGrant(name="every", sha256=key_digest("every-key"), allowed=True)
    some = KeyGrant(name="some", sha256=key_digest("some-key"), allowed=True)
    routes = (route("a", (every, some)), route("b", (every, some.model_copy(update={"allowed": False}))))

    async def check_none(client):
        async with refused(401, "pulling a model writes to this host's disk: it takes a key that may use every"):
            await client.pull("org/m")
        async with refused(401, "deleting a model writes"):
            await client.delete("org/m")

    async def check_some(client):
        async with refused(403, "it takes a key that may use every model"):
            await client.pull("org/m")
        served = await client.pull("a")  # a model it may use: nothing written, nothing refused
        assert served.status == "success"

    async def check_every(client):
        assert (await client.pull("org/m")).status == "success"
        assert (await client.delete("org/m")).status == "success"

    run(check_none, socket_path, routes)
    run(check_some, socket_path, routes, {"Authorization": "Bearer some-key"})
    assert not [c for c in target.calls if c[0] in ("pull", "remove")]
    run(check_every, socket_path, routes, {"Authorization": "Bearer every-key"})
    assert [c[0] for c in target.calls if c[0] in ("pull", "remove")] == ["pull", "remove"]


def test_a_daemon_that_cannot_be_reached_is_a_503(tmp_path):
    async def check(client):
        async with refused(503, "the daemon cannot be reached"):
            await client.pull("org/m")
        async with refused(503, "the daemon cannot be reached"):
            await client.delete("org/m")

    run(check, str(tmp_path / "none.sock"))
