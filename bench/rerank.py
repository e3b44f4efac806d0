"""Reranks (query-document pairs scored) per second.

    python bench/rerank.py [--runs 3] [--write docs/benchmarks.md]

Two cross-encoders, both random weights (no trained cross-encoder ships in a PyPI wheel, so
none can be fetched offline): builtin:tiny-reranker (2 layers, width 32) and one of
ms-marco-MiniLM-L-6-v2's shape (6 layers, width 384, 12 heads), MLX's default init, built
here. Speed depends on the shape, not the weights. Requests of 1, 16 and 64 documents of
~40 tokens beside a ~8-token query: in-process (the reranker alone) and through `vllmmlxd
serve` (POST /v1/rerank with httpx). Best of --runs after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

from common import REPO, cpu_name, publish

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

SIZES = (1, 16, 64)
QUERY = "which animals live high in the mountains of south america?"
MINILM_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}


def documents(n: int) -> list[str]:
    base = [
        "the",
        "llama",
        "and",
        "the",
        "alpaca",
        "are",
        "camelids",
        "of",
        "the",
        "andes",
        "where",
        "herders",
        "keep",
        "them",
        "on",
        "high",
        "pastures",
        "and",
        "the",
        "vicuna",
        "grazes",
        "wild",
        "on",
        "the",
        "grass",
        "of",
        "the",
        "altiplano",
        "far",
        "above",
        "the",
        "forests",
        "and",
        "the",
        "rivers",
        "below",
    ]
    return [" ".join((base[i % 9 :] + base[: i % 9])[: 30 + i % 6]) for i in range(n)]


def minilm_shaped(state: Path) -> Path:
    """A cross-encoder folder of MiniLM-L6's shape with MLX's default random init (made once under the
    state dir): builtin:tiny-reranker's folder with a wider config and weights to match."""
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from vllmmlxd.engine.embeddings.bert import BertConfig
    from vllmmlxd.engine.loading import builtin
    from vllmmlxd.engine.rerank.cross_encoder import BertCrossEncoder

    folder = state / "bench-models" / "cross-encoder-minilm-l6-shape"
    if (folder / "model.safetensors").exists():
        return folder
    shutil.copytree(builtin.ensure_builtin("tiny-reranker", state), folder, dirs_exist_ok=True)
    config = {**json.loads((folder / "config.json").read_text()), **MINILM_SHAPE, "max_position_embeddings": 512}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 512}))
    mx.random.seed(0)
    model = BertCrossEncoder(BertConfig.from_dict(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder


def setup_mlx() -> None:
    from vllmmlxd.runtime.blas import activate
    from vllmmlxd.runtime.cpus import available_cpus

    activate("auto", len(available_cpus()))  # the BLAS a worker would run on, before mlx loads


def in_process(spec: str, runs: int) -> tuple[dict[int, float], float]:
    from vllmmlxd.engine.rerank.reranker import load_reranker
    from vllmmlxd.paths import resolve_state_dir

    reranker = load_reranker(spec, resolve_state_dir())
    out = {}
    try:
        for n in SIZES:
            pairs = reranker.make_pairs(QUERY, documents(n), truncate=True)
            asyncio.run(reranker.score(pairs))
            best = 0.0
            for _ in range(runs):
                started = time.perf_counter()
                asyncio.run(reranker.score(reranker.make_pairs(QUERY, documents(n), truncate=True)))
                best = max(best, n / (time.perf_counter() - started))
            out[n] = best
        tokens = sum(len(p) for p in reranker.make_pairs(QUERY, documents(64), truncate=True)) / 64
    finally:
        reranker.close()
    return out, tokens


def through_server(spec: str, runs: int) -> dict[int, float]:
    import httpx

    server = start_serve(spec, threads=None)
    client = httpx.Client(base_url=server.url, timeout=600)  # one kept-alive connection, as a RAG pipeline holds
    out = {}
    try:
        for n in SIZES:
            body = {"query": QUERY, "documents": documents(n), "return_documents": False}
            client.post("/v1/rerank", json=body).raise_for_status()
            best = 0.0
            for _ in range(runs):
                started = time.perf_counter()
                r = client.post("/v1/rerank", json=body)
                assert len(r.json()["results"]) == n
                best = max(best, n / (time.perf_counter() - started))
            out[n] = best
    finally:
        client.close()
        server.stop()
    return out


def machine() -> str:
    import mlx.core as mx

    return f"{platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--write", type=Path, help="replace the reranking section of this markdown file")
    args = ap.parse_args()
    setup_mlx()
    from vllmmlxd.paths import resolve_state_dir
    from vllmmlxd.runtime.cpus import available_cpus, default_threads

    models = {
        "`builtin:tiny-reranker` (2 layers, width 32)": "builtin:tiny-reranker",
        "MiniLM-L6's shape (6 layers, width 384), random weights": str(minilm_shaped(resolve_state_dir())),
    }
    rows = []
    for label, spec in models.items():
        alone, tokens = in_process(spec, args.runs)
        served = {} if args.skip_server else through_server(spec, args.runs)
        for n in SIZES:
            rows.append(
                f"| {label} | {n} | {alone[n]:.0f} | {served[n]:.0f} |"
                if served
                else f"| {label} | {n} | {alone[n]:.0f} | - |"
            )
            print(rows[-1], flush=True)
        print(f"{label}: mean tokens per pair {tokens:.1f}", flush=True)
    publish(
        [
            "## Reranking: query-document pairs per second (`bench/rerank.py`)",
            "",
            f"- Date: {time.strftime('%Y-%m-%d')}",
            f"- Machine: {machine()}",
            f"- Pairs of ~{tokens:.0f} tokens (query, document, [CLS] and two [SEP]); best of {args.runs} runs after a warm-up;"
            f" the reranker alone on {len(available_cpus())} BLAS threads, the server on a worker's default"
            f" ({default_threads(len(available_cpus()))})",
            "- Random weights (no trained cross-encoder can be fetched offline): the rate depends on the shape, not the weights",
            "",
            "| model | documents per request | pairs/s, reranker alone | pairs/s, `vllmmlxd serve` (POST /v1/rerank) |",
            "|---|---|---|---|",
            *rows,
        ],
        args.write,
    )


if __name__ == "__main__":
    main()
