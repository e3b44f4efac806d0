"""A sharded entry against one process: SmolLM2 as 2 ranks (pipeline, tensor) vs one worker.

    python bench/sharded.py [--tokens 96] [--write docs/benchmarks.md]

Each layout runs alone on the real daemon, one after another, on the same machine (nothing
else loaded): one worker with 2 BLAS threads, then 2 ranks on loopback with MLX's ring backend
and 1 thread each, split by pipeline, then by tensor. For each: a single stream's tokens/s, 4
concurrent streams' total tokens/s, the time to the first token of a ~500-token prompt, and
what the ranks report while decoding (each rank's step time, and the follower's wait for rank
0's frame: the time it spends waiting on rank 0 and the link).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(Path.home() / ".local/state/vllmmlxd"))

from tests.support.daemon import free_port, make_daemon

MODEL = "builtin:smollm2-135m-instruct"
LONG_PROMPT = " ".join(f"item {i} is on shelf {i % 7}." for i in range(70))  # about 500 tokens


def layouts() -> dict[str, dict]:
    ring = free_port()
    return {
        "one process, 2 threads": {"threads": 2},
        "2 ranks, pipeline": {
            "threads": 1,
            "distributed": {"hosts": ["127.0.0.1", "127.0.0.1"], "parallel": "pipeline", "port": ring},
        },
        "2 ranks, tensor": {
            "threads": 1,
            "distributed": {"hosts": ["127.0.0.1", "127.0.0.1"], "parallel": "tensor", "port": ring + 10},
        },
    }


def stream(client: httpx.Client, prompt: str, tokens: int) -> tuple[float, float, int]:
    """(time to first token, seconds, tokens) of one streamed greedy completion."""
    started = time.perf_counter()
    first = None
    n = 0
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                n += 1
                first = first or time.perf_counter()
    return (first or time.perf_counter()) - started, time.perf_counter() - started, n


def sample_ranks(client: httpx.Client, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        dist = client.get("/v1/status").json().get("distributed")
        if dist:
            out.append(dist["ranks"])
        time.sleep(0.2)


def measure(name: str, extra: dict, tokens: int) -> dict:
    d = make_daemon()
    port = free_port()
    d.write({"m": {"model": MODEL, "port": port, "cache_memory_mb": 0, **extra}})
    d.start()
    try:
        d.wait_ready(["m"], timeout=240)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
            stream(c, "Warm up.", 8)
            one = [stream(c, "Tell me a long story.", tokens) for _ in range(2)]
            single = max(n / (s - t) for t, s, n in one)  # decode speed after the first token
            samples: list = []
            stop = threading.Event()
            sampler = threading.Thread(target=sample_ranks, args=(c, stop, samples), daemon=True)
            sampler.start()
            started = time.perf_counter()
            with cf.ThreadPoolExecutor(4) as pool:
                runs = list(pool.map(lambda i: stream(c, f"Story number {i}.", tokens), range(4)))
            batch = sum(n for _, _, n in runs) / (time.perf_counter() - started)
            stop.set()
            sampler.join()
            ttft = min(stream(c, LONG_PROMPT, 1)[0] for _ in range(2))
    finally:
        d.stop()
    ranks = {}
    for key in ("step_ms", "wait_ms"):
        for rank in (0, 1):
            values = [s[rank][key] for s in samples if rank < len(s) and s[rank].get(key) is not None]
            if values:
                ranks[(rank, key)] = statistics.median(values)
    return {"name": name, "single": single, "batch": batch, "ttft": ttft, "ranks": ranks}


def render(results: list[dict], tokens: int) -> str:
    import mlx.core as mx

    base = results[0]
    lines = [
        "## Sharded entries: 2 ranks on one machine vs one process (`bench/sharded.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/sharded.py --tokens {tokens}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__}",
        f"- Model: `{MODEL}` (float32 on this CPU), {tokens} tokens greedy per stream, prefix cache off; "
        "ranks on loopback with the ring backend, 1 BLAS thread each; the one process has 2",
        "",
        "| layout | 1 stream tok/s | 4 streams tok/s | TTFT, 500-token prompt | rank 0 step | rank 1 step | rank 1 waits for rank 0 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rk = r["ranks"]

        def ms(key: tuple) -> str:
            return f"{rk[key]:.1f} ms" if key in rk else "-"

        lines.append(
            f"| {r['name']} | {r['single']:.1f} ({r['single'] / base['single']:.2f}x) | "
            f"{r['batch']:.1f} ({r['batch'] / base['batch']:.2f}x) | {r['ttft'] * 1000:.0f} ms | "
            f"{ms((0, 'step_ms'))} | {ms((1, 'step_ms'))} | {ms((1, 'wait_ms'))} |"
        )
    lines += [
        "",
        "Step times are medians of what `/v1/status` reported every 200 ms while the 4 streams ran. "
        "A rank's *step* is its own `BatchGenerator.next()`; rank 1's *wait* is the time it spends in "
        "the frame collective waiting for rank 0 (rank 0's own work between steps, plus the link).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    results = [measure(name, extra, args.tokens) for name, extra in layouts().items()]
    text = render(results, args.tokens)
    print(text)
    if args.write:
        write_section(args.write, text.splitlines()[0], text)


if __name__ == "__main__":
    main()
