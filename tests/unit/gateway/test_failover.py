"""Failover in a replica set, on the gateway's real app and client against fake upstream servers
(real sockets): what is retried on the next member and what is relayed, the backend header, ejection,
the counts, affinity. Each fake counts the requests it received."""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import asynccontextmanager

import httpx
import uvicorn

from tests.support.servers import free_port
from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.gateway.app import create_app
from vllmmlxd.gateway.dispatch import Gateway
from vllmmlxd.gateway.routing import build_table
from vllmmlxd.supervisor.slot.responder import answer, unavailable

CHAT = {"model": "g", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _http(status: str, body: dict, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n{extra}\r\n"
    return head.encode() + data


class Fake:
    """One upstream: ``kind`` says how it answers (ok, closes before the head, stand-in 503, 500, a
    stream that breaks after its head)."""

    def __init__(self, name: str, kind: str):
        self.name, self.kind, self.hits = name, kind, 0
        self.bodies: list[dict] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                self.bodies.append(json.loads(await reader.readexactly(length)))
                self.hits += 1
                if self.kind == "close":
                    break
                if self.kind == "stand-in":
                    writer.write(answer(unavailable(self.name, "starting", None, None), "/v1/chat/completions"))
                    break
                if self.kind == "500":
                    writer.write(
                        _http("500 Internal Server Error", {"error": {"message": "boom", "type": "server_error"}})
                    )
                elif self.kind == "stream-breaks":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                    writer.write(b'e\r\ndata: {"a":1}\n\n\r\n')
                    await writer.drain()
                    break
                else:
                    writer.write(_http("200 OK", {"answered_by": self.name, "model": self.bodies[-1].get("model")}))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@asynccontextmanager
async def replica_set(*kinds: str, extra_routes: tuple[Route, ...] = ()):
    """A gateway over one set ``g`` whose members answer as ``kinds`` (``refused``: a port nobody listens on)."""
    fakes: list[Fake] = []
    routes = []
    for i, kind in enumerate(kinds):
        name = f"m{i}"
        if kind == "refused":
            url = f"http://127.0.0.1:{free_port()}"
        else:
            fake = Fake(name, kind)
            await fake.start()
            fakes.append(fake)
            url = f"http://127.0.0.1:{fake.port}"
        routes.append(Route(name=name, served_model_name=f"served-{name}", url=url, state="ready", group="g"))
    gateway = Gateway(build_table(GatewaySpec(gateway={}, routes=(*routes, *extra_routes))))
    # Served by uvicorn on a real socket, as the gateway process is: a cut stream is a cut connection.
    server = uvicorn.Server(uvicorn.Config(create_app(gateway), log_level="warning", lifespan="off"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        try:
            yield gateway, client, {f.name: f for f in fakes}
        finally:
            server.should_exit = True
            await serving
            await gateway.client.aclose()
            for fake in fakes:
                await fake.stop()


def run(coro):
    return asyncio.run(coro)


def test_a_refused_member_and_one_that_closes_before_the_head_are_passed_for_the_next():
    async def go():
        async with replica_set("refused", "close", "ok") as (gateway, client, fakes):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.headers["x-vllmmlxd-backend"] == "m2"
            assert r.json() == {"answered_by": "m2", "model": "served-m2"}  # the member's own name
            assert (fakes["m1"].hits, fakes["m2"].hits) == (1, 1)  # each tried once
            assert "m0" in gateway.replicas.ejected_until and "m1" not in gateway.replicas.ejected_until
            health = (await client.get("/api/health")).json()["groups"]["g"]
            assert health["members"]["m0"]["ejected"] and not health["members"]["m1"]["ejected"]
            assert gateway.replicas.outstanding == {"m1": 0, "m2": 0, "m0": 0} and gateway.in_flight == 0

    run(go())


def test_the_daemons_stand_in_is_passed_and_its_member_ejected():
    async def go():
        async with replica_set("stand-in", "ok") as (gateway, client, fakes):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.headers["x-vllmmlxd-backend"] == "m1"
            assert fakes["m0"].hits == 1 and "m0" in gateway.replicas.ejected_until
            # Ejected: the next requests go to the other member first, without a try on the first.
            for _ in range(3):
                assert (await client.post("/v1/chat/completions", json=CHAT)).headers["x-vllmmlxd-backend"] == "m1"
            assert fakes["m0"].hits == 1

    run(go())


def test_a_workers_own_error_is_relayed_and_not_retried():
    async def go():
        async with replica_set("500", "ok") as (gateway, client, fakes):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 500 and r.json()["error"]["message"] == "boom"
            assert r.headers["x-vllmmlxd-backend"] == "m0"
            assert (fakes["m0"].hits, fakes["m1"].hits) == (1, 0)
            assert not gateway.replicas.ejected_until

    run(go())


def test_a_stream_that_breaks_after_its_head_is_cut_not_retried():
    async def go():
        async with replica_set("stream-breaks", "ok") as (_gateway, client, fakes):
            got = b""
            try:
                async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                    assert r.status_code == 200 and r.headers["x-vllmmlxd-backend"] == "m0"
                    async for chunk in r.aiter_raw():
                        got += chunk
            except httpx.HTTPError:
                pass  # the cut: either an error or an unfinished body, never a clean retry
            assert b"data: [DONE]" not in got
            assert (fakes["m0"].hits, fakes["m1"].hits) == (1, 0)

    run(go())


def test_when_no_member_can_answer_the_gateways_error_is_in_the_familys_shape_and_names_no_entry():
    async def go():
        async with replica_set("refused", "close") as (gateway, client, _fakes):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 503 and "x-vllmmlxd-backend" not in r.headers
            assert r.json()["error"]["code"] == "model_unavailable" and "m0" not in r.text and "m1" not in r.text
            anth = await client.post(
                "/v1/messages", json={**CHAT, "max_tokens": 2}, headers={"anthropic-version": "2023-06-01"}
            )
            # Anthropic's own shape: overloaded is a 529 there.
            assert anth.status_code == 529 and anth.json()["error"]["type"] == "overloaded_error"
            assert gateway.in_flight == 0 and set(gateway.replicas.outstanding.values()) == {0}

    run(go())


def test_single_routes_carry_the_backend_header_and_gateway_errors_do_not():
    async def go():
        fake = Fake("solo", "ok")
        await fake.start()
        solo = Route(name="solo", served_model_name="solo-1", url=f"http://127.0.0.1:{fake.port}", state="ready")
        async with replica_set("ok", "ok", extra_routes=(solo,)) as (_gateway, client, _fakes):
            r = await client.post("/v1/chat/completions", json={**CHAT, "model": "solo-1"})
            assert r.status_code == 200 and r.headers["x-vllmmlxd-backend"] == "solo"
            assert r.json()["model"] == "solo-1"
            missing = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
            assert missing.status_code == 404 and "x-vllmmlxd-backend" not in missing.headers
            bad = await client.post("/v1/chat/completions", content=b"{not json")
            assert bad.status_code == 400 and "x-vllmmlxd-backend" not in bad.headers
            # A member named by its own name is a single route: the client's body goes as it is.
            own = await client.post("/v1/chat/completions", json={**CHAT, "model": "m1"})
            assert own.headers["x-vllmmlxd-backend"] == "m1" and own.json()["model"] == "m1"
        await fake.stop()

    run(go())


def test_a_conversation_stays_on_the_member_that_answered_it_and_a_burst_spreads():
    async def go():
        async with replica_set("ok", "ok") as (_gateway, client, fakes):
            messages = [{"role": "user", "content": "hello there"}]
            seen = []
            for turn in range(4):
                r = await client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
                seen.append(r.headers["x-vllmmlxd-backend"])
                messages = [*messages, {"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": "go"}]
            assert len(set(seen)) == 1
            # Different conversations, one after the other: round-robin over idle members.
            others = []
            for n in range(4):
                body = {**CHAT, "messages": [{"role": "user", "content": f"other {n}"}]}
                others.append((await client.post("/v1/chat/completions", json=body)).headers["x-vllmmlxd-backend"])
            assert set(others) == {"m0", "m1"}
            assert sum(f.hits for f in fakes.values()) == 8

    run(go())


def test_listings_show_the_group_once_with_its_members():
    async def go():
        async with replica_set("ok", "ok") as (_gateway, client, _fakes):
            cards = (await client.get("/v1/models")).json()["data"]
            groups = [c for c in cards if c["id"] == "g"]
            assert len(groups) == 1 and groups[0]["members"] == ["m0", "m1"] and groups[0]["kind"] == "group"
            assert {"served-m0", "served-m1"} <= {c["id"] for c in cards}
            listed = (await client.get("/api/models")).json()["data"]
            assert [m["members"] for m in listed if m["id"] == "g"] == [["m0", "m1"]]
            health = (await client.get("/api/health")).json()
            assert set(health["models"]) == {"m0", "m1"} and health["groups"]["g"]["state"] == "ready"

    run(go())
