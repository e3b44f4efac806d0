"""Embeddings per second, and what embedding load does to a generation's inter-token gap.

    python bench/embeddings.py [--runs 3] [--itl-tokens 96] [--write docs/benchmarks.md]

1. Throughput of builtin:all-minilm-l6-v2 for requests of 1, 16 and 64 inputs of ~32
   tokens: in-process (the embedder alone) and through `vllmmlxd serve` (the official SDK's
   default, base64). Best of --runs after a warm-up.
2. The inter-token gap of one greedy SmolLM2-135M generation, in-process, while 64-input
   embedding requests arrive back to back, for the two designs: the embedder on its own
   thread running concurrently with the engine's, and each embedding batch run on the
   engine thread just before one of its steps (what vllmmlxd does: EngineTurns).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

EMBEDDER = "builtin:all-minilm-l6-v2"
LLM = "builtin:smollm2-135m-instruct"
SIZES = (1, 16, 64)


def texts(n: int) -> list[str]:
    # ~32 tokens each with [CLS] and [SEP]; varied, so batches are not all one length.
    base = (
        "the quick brown fox jumps over the lazy dog while the old cat sleeps in the warm afternoon sun "
        "near a quiet river where children play and birds sing above the tall green trees"
    )
    words = base.split()
    return [" ".join((words[(i % 7) :] + words[: (i % 7)])[: 28 + i % 5]) for i in range(n)]


def setup_mlx():
    from vllmmlxd.runtime.blas import activate
    from vllmmlxd.runtime.cpus import available_cpus

    activate("auto", len(available_cpus()))  # the BLAS a worker would run on, before mlx loads


def in_process(runs: int) -> dict[int, float]:
    from vllmmlxd.engine.embeddings.embedder import load_embedder
    from vllmmlxd.paths import resolve_state_dir

    embedder = load_embedder(EMBEDDER, resolve_state_dir())
    out = {}
    try:
        for n in SIZES:
            inputs = embedder.tokenize(texts(n))
            asyncio.run(embedder.embed(inputs))
            best = 0.0
            for _ in range(runs):
                started = time.perf_counter()
                asyncio.run(embedder.embed(inputs))
                best = max(best, n / (time.perf_counter() - started))
            out[n] = best
        tokens = sum(len(x) for x in embedder.tokenize(texts(64))) / 64
        print(f"mean tokens per input: {tokens:.1f}")
    finally:
        embedder.close()
    return out


def through_server(runs: int) -> dict[int, float]:
    import openai

    server = start_serve(EMBEDDER)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)
    out = {}
    try:
        for n in SIZES:
            batch = texts(n)
            client.embeddings.create(model="all-minilm-l6-v2", input=batch)
            best = 0.0
            for _ in range(runs):
                started = time.perf_counter()
                r = client.embeddings.create(model="all-minilm-l6-v2", input=batch)
                assert len(r.data) == n
                best = max(best, n / (time.perf_counter() - started))
            out[n] = best
    finally:
        server.stop()
    return out


def inter_token_gaps(mode: str, tokens: int) -> tuple[list[float], int]:
    """Gaps between one generation's tokens (seconds) under ``mode`` load, and inputs embedded meanwhile.

    mode: ``none`` (no embedding load), ``thread`` (the embedder's thread, alone), ``turns``
    (vllmmlxd: batches handed to the engine thread, one before each step, while it generates:
    engine/embeddings/embedder.py EngineTurns).
    """
    from vllmmlxd.engine.embeddings.embedder import MLXEmbedder
    from vllmmlxd.engine.loading import builtin
    from vllmmlxd.engine.loading.loader import load_model
    from vllmmlxd.engine.mlx_engine import MLXEngine
    from vllmmlxd.engine.options import EngineOptions
    from vllmmlxd.engine.types import GenerationRequest, SamplingParams, TextDelta
    from vllmmlxd.paths import resolve_state_dir

    state = resolve_state_dir()
    engine = MLXEngine(load_model(LLM, state), options=EngineOptions(cache_budget_bytes=0))
    folder = builtin.ensure_builtin(EMBEDDER.split(":", 1)[1], state)
    embedder = MLXEmbedder(folder, name="e", source=EMBEDDER, threaded=(mode in ("thread", "turns")))
    if mode == "turns":
        embedder.share_engine_thread(engine)
    inputs = embedder.tokenize(texts(64))
    embedded = 0

    async def load(stop: asyncio.Event) -> None:
        nonlocal embedded
        while not stop.is_set():
            await embedder.embed(inputs)
            embedded += len(inputs)

    async def run() -> list[float]:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        prompt = engine.tokenize("Write a long story about a lighthouse keeper.")
        stop = asyncio.Event()
        loader = asyncio.create_task(load(stop)) if mode != "none" else None
        await asyncio.sleep(0.2)  # the load is running before the first token
        stamps = []
        async for event in engine.generate(GenerationRequest(prompt, params)):
            if isinstance(event, TextDelta):
                stamps.append(time.perf_counter())
        stop.set()
        if loader is not None:
            await loader
        return [b - a for a, b in zip(stamps[5:], stamps[6:])]  # past the first few (prefill, warm-up)

    try:
        asyncio.run(run())  # warm-up
        embedded = 0
        gaps = asyncio.run(run())
    finally:
        embedder.close()
        engine.close()
    return gaps, embedded


def machine() -> str:
    import mlx.core as mx

    return f"{platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--itl-tokens", type=int, default=96)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--modes", default="none,thread,turns", help="which inter-token measurements to run")
    ap.add_argument("--write", type=Path, help="replace the embeddings section of this markdown file")
    args = ap.parse_args()
    setup_mlx()
    alone = {n: 0.0 for n in SIZES} if args.skip_throughput else in_process(args.runs)
    print(alone, flush=True)
    server = {} if args.skip_server or args.skip_throughput else through_server(args.runs)
    print(server, flush=True)
    rows = "\n".join(
        f"| {n} | {alone[n]:.0f} | {server[n]:.0f} |" if server else f"| {n} | {alone[n]:.0f} | - |" for n in SIZES
    )
    itl = []
    for mode, label in (
        ("none", "no embedding load"),
        ("thread", "embedder on its own thread, concurrent with the engine"),
        ("turns", "embedding batches between decode steps (vllmmlxd: EngineTurns)"),
    ):
        if mode not in args.modes.split(","):
            continue
        gaps, embedded = inter_token_gaps(mode, args.itl_tokens)
        gaps_ms = sorted(g * 1000 for g in gaps)
        p90 = gaps_ms[int(0.9 * (len(gaps_ms) - 1))]
        seconds = sum(gaps) or 1
        itl.append(
            f"| {label} | {statistics.median(gaps_ms):.1f} | {p90:.1f} | {gaps_ms[-1]:.1f} | "
            f"{1000 / statistics.mean(gaps_ms):.1f} | {embedded / seconds:.0f} |"
        )
        print(itl[-1], flush=True)
    heading = "## Embeddings: `builtin:all-minilm-l6-v2`"
    report = (
        f"{heading}\n\n"
        f"- Date: {time.strftime('%Y-%m-%d')}\n"
        f"- Machine: {machine()}\n"
        f"- Inputs of ~32 tokens; best of {args.runs} runs after a warm-up\n\n"
        "| inputs per request | embeddings/s, embedder alone | embeddings/s, `vllmmlxd serve` (SDK, base64) |\n"
        "|---|---|---|\n"
        f"{rows}\n\n"
        f"Inter-token gap of one greedy `{LLM}` generation ({args.itl_tokens} tokens) while 64-input "
        "requests are embedded back to back:\n\n"
        "| design | median ms | p90 ms | max ms | tokens/s | embeddings/s meanwhile |\n|---|---|---|---|---|---|\n"
        + "\n".join(itl)
        + "\n"
    )
    print(report)
    if args.write:
        write_section(args.write, heading, report, intro="# Benchmarks\n\nMeasured with the scripts in `bench/`.\n")


if __name__ == "__main__":
    main()
