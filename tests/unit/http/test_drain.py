import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from vllmmlxd.http.drain import CloseWhenDraining


def make_client(state: dict) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/", lambda r: PlainTextResponse("hi", headers={"connection": "keep-alive"}))])
    app.add_middleware(CloseWhenDraining, draining=lambda: state["draining"])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w")


def test_responses_say_connection_close_only_while_draining():
    async def run():
        state = {"draining": False}
        async with make_client(state) as client:
            before = await client.get("/")
            state["draining"] = True
            during = await client.get("/")
        return before, during

    before, during = asyncio.run(run())
    assert before.headers["connection"] == "keep-alive" and before.text == "hi"
    assert during.headers.get_list("connection") == ["close"] and during.text == "hi"
