"""Streamed completion tokens/s: the HTTP server against the engine alone, same model, one run.

    python bench/stream_overhead.py [--model builtin:smollm2-135m-instruct] [--tokens 256] [--write docs/benchmarks.md]

The engine is measured in-process (its event stream read from asyncio, as the server
reads it); then `vllmmlxd serve` is started on the same model and one streamed
/v1/completions request is read with httpx. Each side takes the best of --runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

PROMPT = "Write a long story about a lighthouse keeper."


def engine_alone(model: str, tokens: int, runs: int) -> float:
    from vllmmlxd.runtime.blas import activate
    from vllmmlxd.runtime.cpus import available_cpus

    activate("auto", len(available_cpus()))  # the BLAS a worker would run on, before mlx loads
    from vllmmlxd.engine.loading.loader import load_model
    from vllmmlxd.engine.mlx_engine import MLXEngine
    from vllmmlxd.engine.options import EngineOptions
    from vllmmlxd.engine.types import Finished, GenerationRequest, SamplingParams
    from vllmmlxd.paths import resolve_state_dir

    engine = MLXEngine(load_model(model, resolve_state_dir()), options=EngineOptions(cache_budget_bytes=0))
    prompt = engine.tokenize(PROMPT)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)

    async def one() -> float:
        started = time.perf_counter()
        async for event in engine.generate(GenerationRequest(prompt, params)):
            if isinstance(event, Finished):
                assert event.usage.completion_tokens == tokens
        return tokens / (time.perf_counter() - started)

    try:
        asyncio.run(one())  # warm-up
        return max(asyncio.run(one()) for _ in range(runs))
    finally:
        engine.close()


def through_server(model: str, tokens: int, runs: int) -> float:
    server = start_serve(model, "--max-tokens", str(tokens))
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    best = 0.0
    try:
        for i in range(runs + 1):
            started = time.perf_counter()
            chunks = 0
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
            rate = tokens / (time.perf_counter() - started)
            if i:  # the first run warms up
                best = max(best, rate)
    finally:
        server.stop()
    return best


def machine() -> str:
    import mlx.core as mx

    return f"{platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", type=Path, help="replace the stream-overhead section of this markdown file")
    args = ap.parse_args()
    engine = engine_alone(args.model, args.tokens, args.runs)
    server = through_server(args.model, args.tokens, args.runs)
    ratio = server / engine
    heading = f"## Streaming overhead: server vs engine, `{args.model}`"
    report = (
        f"{heading}\n\n"
        f"- Date: {time.strftime('%Y-%m-%d')}\n"
        f"- Machine: {machine()}\n"
        f"- Model: `{args.model}`, {args.tokens} tokens greedy, `ignore_eos`, best of {args.runs} runs after a warm-up\n\n"
        "| path | tokens/s |\n|---|---|\n"
        f"| engine alone (in-process event stream) | {engine:.1f} |\n"
        f"| `vllmmlxd serve`, streamed `/v1/completions` over HTTP | {server:.1f} |\n\n"
        f"The server keeps **{ratio:.1%}** of the engine's single-stream speed (goal: at least 95%).\n"
    )
    print(report)
    if args.write:
        write_section(args.write, heading, report, intro="# Benchmarks\n\nMeasured with the scripts in `bench/`.\n")


if __name__ == "__main__":
    main()
