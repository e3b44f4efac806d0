"""What the gateway adds: time to first byte, per-chunk latency and streamed tokens/s, through it vs direct.

    python bench/gateway.py [--requests 40] [--write docs/benchmarks.md]

Two measurements, each interleaving direct and gateway requests so that load on the
machine hits both alike:

- *Pass-through*, against a synthetic SSE server started here: it answers at once and
  writes a chunk every 10 ms, each stamped with the monotonic clock (shared by every process
  on the machine), so the client reads each chunk's delay exactly; the gateway's share is
  the difference between the two paths. No model noise. A third path, a bare TCP relay (an
  asyncio process copying bytes both ways, no HTTP), is the floor any second hop in Python
  pays on the machine: the gateway's own share is what it adds over the relay.
- *A real model*: `builtin:tiny` served by a `vllmmlxd serve` worker, streamed
  /v1/chat/completions, time to first token and tokens/s.

The gateway is run as the daemon runs it (`python -m vllmmlxd.gateway`, spec on stdin).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))

from tests.support.servers import free_port, start_serve
from vllmmlxd.sockets import bind_tcp

CHUNKS = 50
CHUNK_EVERY_S = 0.01


def synthetic_sse_server(port: int) -> threading.Thread:
    """An HTTP/1.1 server streaming CHUNKS SSE events, each carrying the time it was written."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                for i in range(CHUNKS):
                    event = f"data: {json.dumps({'i': i, 't': time.monotonic_ns()})}\n\n".encode()
                    writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(CHUNK_EVERY_S)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def run() -> None:
        async def main() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", port)
            async with server:
                await server.serve_forever()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


RELAY = """
import asyncio, sys

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
    except ConnectionError:
        pass
    finally:
        writer.close()

async def handle(reader, writer):
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


def tcp_relay(target_port: int) -> tuple[subprocess.Popen, str]:
    """A bare TCP relay to ``target_port`` in its own process, and its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", RELAY, str(port), str(target_port)], stdout=subprocess.PIPE)
    atexit.register(proc.kill)  # however the run ends
    proc.stdout.readline()
    return proc, f"http://127.0.0.1:{port}"


class Gateway:
    def __init__(self, routes: list[dict]):
        # As the daemon does: it binds the socket and the gateway inherits it (``--fd``).
        listen = bind_tcp("127.0.0.1", 0)
        self.port = listen.getsockname()[1]
        folder = Path(tempfile.mkdtemp(prefix="vllmmlxd-bench-gw-"))
        spec = {"gateway": {"host": "127.0.0.1", "port": self.port}, "routes": routes, "version": 1}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllmmlxd.gateway",
                "--fd",
                str(listen.fileno()),
                "--health-socket",
                str(folder / "gw.sock"),
                "--state-dir",
                str(folder),
                "--log-level",
                "warning",
            ],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=[listen.fileno()],
        )
        listen.close()
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")
        self.proc.stdin.flush()
        for _ in range(300):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the gateway did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.stdin.close()  # EOF: it drains and exits
        self.proc.wait(30)


def synthetic_run(client: httpx.Client, base: str) -> tuple[float, list[float]]:
    """Time to the first byte and each chunk's delay (read time - write time), in ms."""
    delays, first = [], None
    started = time.perf_counter()
    with client.stream("POST", base + "/v1/chat/completions", json={"model": "synthetic", "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                now = time.monotonic_ns()
                first = first or (time.perf_counter() - started) * 1000
                delays.append((now - json.loads(line[6:])["t"]) / 1e6)
    return first or 0.0, delays


def model_run(client: httpx.Client, base: str, tokens: int) -> tuple[float, float]:
    """Time to the first token (ms) and tokens/s of one streamed chat completion."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = (time.perf_counter() - started) * 1000
    return first or 0.0, tokens / (time.perf_counter() - started)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) >= 10 else float("nan")


def verdict(ttfb: float, chunk: float, relay_ttfb: float, relay_chunk: float, cores: int) -> str:
    """What the numbers say about the goal, in words."""
    met = ttfb < 2 and chunk < 2
    text = (
        f"The gateway ran as the daemon runs it (on an inherited listening socket, logging at warning). "
        f"It added {ttfb:.2f} ms to the first byte and {chunk:.3f} ms to each chunk; a bare TCP relay, "
        f"which only copies bytes, already adds {relay_ttfb:.2f} ms and {relay_chunk:.3f} ms (two more loopback "
        f"hops and a process woken on each), so the gateway's own work (HTTP parsing on both sides, routing, "
        f"the upstream request) is about {ttfb - relay_ttfb:.2f} ms of the first byte and "
        f"{chunk - relay_chunk:.3f} ms of a chunk. "
    )
    if met:
        return text + f"The goal is met on this {cores}-core machine.\n"
    return text + (
        f"The goal is not met on this {cores}-core machine: client, gateway and server share {cores} cores, "
        "so every hop also waits for a core, and the relay's share shows how much of that a second hop "
        "costs before any HTTP work.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40, help="per path and measurement")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()

    synthetic_port = free_port()
    synthetic_sse_server(synthetic_port)
    worker = start_serve("builtin:tiny", "--served-model-name", "tiny", "--max-tokens", str(args.tokens))
    direct_synthetic = f"http://127.0.0.1:{synthetic_port}"
    relay, relay_url = tcp_relay(synthetic_port)
    gateway = Gateway(
        [
            {"name": "synthetic", "served_model_name": "synthetic", "url": direct_synthetic, "state": "ready"},
            {"name": "tiny", "served_model_name": "tiny", "url": worker.url, "state": "ready"},
        ]
    )
    results: dict[str, dict[str, list[float]]] = {
        p: {"ttfb": [], "chunk": [], "ttft": [], "tps": []} for p in ("direct", "gateway", "relay")
    }
    try:
        with httpx.Client(timeout=120) as client:
            for _ in range(3):  # warm-up: pools, caches
                synthetic_run(client, gateway.url)
                model_run(client, gateway.url, args.tokens)
            synthetic_run(client, relay_url)
            paths = (("direct", direct_synthetic), ("gateway", gateway.url), ("relay", relay_url))
            for i in range(args.requests):
                for path, base in paths[i % 3 :] + paths[: i % 3]:  # each path first, second, last in turn
                    ttfb, delays = synthetic_run(client, base)
                    results[path]["ttfb"].append(ttfb)
                    results[path]["chunk"] += delays
            for i in range(args.requests):
                for path, base in (("direct", worker.url), ("gateway", gateway.url))[:: 1 if i % 2 else -1]:
                    ttft, tps = model_run(client, base, args.tokens)
                    results[path]["ttft"].append(ttft)
                    results[path]["tps"].append(tps)
    finally:
        gateway.stop()
        worker.stop()
        relay.kill()
        relay.wait()

    d, g, r = results["direct"], results["gateway"], results["relay"]
    added_ttfb = median(g["ttfb"]) - median(d["ttfb"])
    added_chunk = median(g["chunk"]) - median(d["chunk"])
    added_ttft = median(g["ttft"]) - median(d["ttft"])
    import mlx.core as mx

    heading = "## Gateway overhead: through the gateway vs direct (`bench/gateway.py`)"
    report = (
        f"{heading}\n\n"
        f"- Date: {time.strftime('%Y-%m-%d')}\n"
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, "
        f"MLX {mx.__version__}\n"
        f"- {args.requests} requests per path and measurement, direct and gateway interleaved, after a warm-up; "
        "medians (p90 in brackets), milliseconds\n\n"
        "| measurement | direct | through the gateway | added by the gateway |\n|---|---|---|---|\n"
        f"| synthetic SSE: time to first byte | {median(d['ttfb']):.2f} ({p90(d['ttfb']):.2f}) | "
        f"{median(g['ttfb']):.2f} ({p90(g['ttfb']):.2f}) | **{added_ttfb:+.2f}** |\n"
        f"| synthetic SSE: each chunk's delay ({CHUNKS} chunks, 10 ms apart) | {median(d['chunk']):.3f} "
        f"({p90(d['chunk']):.3f}) | {median(g['chunk']):.3f} ({p90(g['chunk']):.3f}) | **{added_chunk:+.3f}** |\n"
        f"| synthetic SSE through a bare TCP relay (the floor of a second hop): time to first byte | "
        f"{median(d['ttfb']):.2f} | {median(r['ttfb']):.2f} ({p90(r['ttfb']):.2f}) | "
        f"{median(r['ttfb']) - median(d['ttfb']):+.2f} |\n"
        f"| synthetic SSE through a bare TCP relay: each chunk's delay | {median(d['chunk']):.3f} | "
        f"{median(r['chunk']):.3f} ({p90(r['chunk']):.3f}) | {median(r['chunk']) - median(d['chunk']):+.3f} |\n"
        f"| `builtin:tiny` chat, time to first token | {median(d['ttft']):.1f} ({p90(d['ttft']):.1f}) | "
        f"{median(g['ttft']):.1f} ({p90(g['ttft']):.1f}) | {added_ttft:+.1f} |\n"
        f"| `builtin:tiny` chat, {args.tokens} tokens: tokens/s | {median(d['tps']):.1f} | {median(g['tps']):.1f} | "
        f"{median(g['tps']) / median(d['tps']) - 1:+.1%} |\n\n"
        "Goal: under 2 ms added to the time to first byte and to each chunk on loopback.\n\n"
        + verdict(
            added_ttfb,
            added_chunk,
            median(r["ttfb"]) - median(d["ttfb"]),
            median(r["chunk"]) - median(d["chunk"]),
            os.cpu_count() or 0,
        )
    )
    print(report)
    if args.write:
        write_section(args.write, heading, report, intro="# Benchmarks\n\nMeasured with the scripts in `bench/`.\n")


if __name__ == "__main__":
    main()
