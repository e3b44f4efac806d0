"""What an image costs: its prefill, and what image requests do to text streams decoding beside them.

    python bench/vision.py [--model tiny|smolvlm-256m|both] [--write docs/benchmarks.md]

Each model is served by a real `vllmmlxd serve` worker and called over HTTP (streamed chat
completions, greedy):

1. *Prefill of one image*: the time to first token of a question with one new picture (cold:
   a picture never sent before, so the vision tower runs), of the same conversation sent again
   (a prefix-cache hit: the tower does not run), and of a text-only question of about the same
   number of prompt tokens (the decoder's own prefill, no tower). Median of --runs.
2. *Decoding beside image requests*: four text streams of 64 tokens alone, then the same four
   while four image requests (new pictures) arrive together: the text streams' tokens/s and
   their longest gap between two tokens.

Models: `builtin:tiny-vlm`, and a random-weight model of SmolVLM-256M's shapes (SmolLM2-135M's
decoder, a 12-layer 768-wide SigLIP tower on 512 px tiles, 64 tokens a tile), built here from
builtin:tiny's tokenizer; its processor caps pictures at 512 px, so a picture is one tile and
the global one (128 image tokens; SmolVLM-256M itself goes up to 2048 px, 17 tiles).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

SMOLVLM_256M = {
    "text_config": {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
    },
    "vision_config": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "patch_size": 16,
        "image_size": 512,
    },
    "scale_factor": 4,
}


def smolvlm_256m_folder() -> Path:
    """The SmolVLM-256M-shaped random model, built once into the state dir."""
    from vllmmlxd.engine.loading import builtin_vlm
    from vllmmlxd.engine.loading.builtin import ensure_builtin
    from vllmmlxd.paths import models_dir, resolve_state_dir

    state = resolve_state_dir()
    folder = models_dir(state) / "bench-smolvlm-256m-random"
    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(json.dumps(builtin_vlm.CONFIG))
    config["text_config"].update(SMOLVLM_256M["text_config"])
    config["vision_config"].update(SMOLVLM_256M["vision_config"])
    config["scale_factor"] = SMOLVLM_256M["scale_factor"]
    preprocessor = {**builtin_vlm.PREPROCESSOR, "size": {"longest_edge": 512}, "max_image_size": {"longest_edge": 512}}
    print("building a random SmolVLM-256M-shaped model (once)", file=sys.stderr)
    builtin_vlm.build_vlm(folder, ensure_builtin("tiny", state), config, preprocessor)
    return folder


def picture(seed: int) -> str:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((300, 400, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def stream(url: str, content, max_tokens: int) -> dict:
    """One streamed greedy chat completion: time to first token, token times, prompt tokens."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    started = time.perf_counter()
    times: list[float] = []
    usage = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    return {"ttft": times[0] - started, "times": times, "prompt_tokens": usage.get("prompt_tokens")}


def asking(image: str | None, words: int = 8) -> list | str:
    text = "What is in the picture? " + "Tell me everything you see in it. " * (words // 8)
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image}}] if image else text


def measure(spec: str, name: str, runs: int) -> dict:
    server = start_serve(spec, "--timeout", "600", "--max-image-mb", "5")
    try:
        url = server.url
        stream(url, asking(picture(999)), 4)  # warm-up: the first image pays for imports and compilation
        cold, hit = [], []
        for i in range(runs):
            image = picture(i)
            cold.append(stream(url, asking(image), 4))
            hit.append(stream(url, asking(image), 4))
        image_tokens = cold[0]["prompt_tokens"]
        # A text question of about the image question's length (the decoder's prefill alone).
        words = 8
        while stream(url, asking(None, words), 1)["prompt_tokens"] < image_tokens - 8:
            words += 8
        text = [stream(url, asking(None, words) + f" ({i})", 4) for i in range(runs)]
        prompts = [f"Write a long story about {t}." for t in ("cats", "rivers", "bread", "the moon")]
        with ThreadPoolExecutor(4) as pool:
            alone = list(pool.map(lambda p: stream(url, p, 64), prompts))
        with ThreadPoolExecutor(8) as pool:
            beside = [pool.submit(stream, url, p, 64) for p in prompts]
            time.sleep(min(r["ttft"] for r in alone) + 0.2)  # the text streams are decoding
            images = [pool.submit(stream, url, asking(picture(100 + i)), 16) for i in range(4)]
            beside_done = [f.result() for f in beside]
            [f.result() for f in images]
        return {
            "name": name,
            "image_prompt_tokens": image_tokens,
            "text_prompt_tokens": text[0]["prompt_tokens"],
            "cold": statistics.median(r["ttft"] for r in cold),
            "hit": statistics.median(r["ttft"] for r in hit),
            "text": statistics.median(r["ttft"] for r in text),
            "alone": rates(alone),
            "beside": rates(beside_done),
        }
    finally:
        server.stop()


def rates(results: list[dict]) -> dict:
    """Tokens/s of each stream after its first token (mean), and the longest gap of any."""
    speeds = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]) for r in results]
    gaps = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    return {"tok_s": statistics.mean(speeds), "max_gap": max(gaps), "median_gap": statistics.median(gaps)}


def report(results: list[dict]) -> str:
    import mlx.core as mx

    lines = [
        "## Images: prefill of one image, and text decoding beside image requests (`bench/vision.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/vision.py`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}",
        "- Each model served by `vllmmlxd serve`, streamed greedy chat completions over HTTP; a picture is 400 x 300",
        "  random pixels (PNG); times to first token are medians; the text streams are 4 requests of 64 tokens",
        "",
        "| model | image prompt (tokens) | TTFT, new image | TTFT, same image again (cache hit) | TTFT, text of ~ the same length |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['name']} | {r['image_prompt_tokens']} | {r['cold'] * 1000:.0f} ms | {r['hit'] * 1000:.0f} ms | "
            f"{r['text'] * 1000:.0f} ms ({r['text_prompt_tokens']} tokens) |"
        )
    lines += [
        "",
        "| model | 4 text streams alone: tok/s each, longest gap | beside 4 image requests: tok/s each, longest gap |",
        "|---|---|---|",
    ]
    for r in results:
        a, b = r["alone"], r["beside"]
        lines.append(
            f"| {r['name']} | {a['tok_s']:.1f}, {a['max_gap'] * 1000:.0f} ms | {b['tok_s']:.1f}, {b['max_gap'] * 1000:.0f} ms |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("tiny", "smolvlm-256m", "both"), default="both")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", type=Path, help="replace this section of a markdown file")
    args = parser.parse_args()
    results = []
    if args.model in ("tiny", "both"):
        results.append(measure("builtin:tiny-vlm", "`builtin:tiny-vlm`", args.runs))
    if args.model in ("smolvlm-256m", "both"):
        results.append(measure(str(smolvlm_256m_folder()), "SmolVLM-256M shapes (random)", args.runs))
    text = report(results)
    print(text)
    if args.write:
        write_section(args.write, text.splitlines()[0], text)


if __name__ == "__main__":
    main()
