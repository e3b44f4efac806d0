"""Speculative decoding: tokens/s with prompt lookup on and off, side by side, on one worker.

    python bench/speculative.py [--model builtin:smollm2-135m-instruct] [--runs 2] [--write docs/benchmarks.md]

One `vllmmlxd serve MODEL --speculative prompt-lookup` worker (adaptive, as users run it); each
measurement sends the same requests with speculation on and with it off for the request
(`"speculative": false`), interleaved, greedy, streamed over HTTP:

- *edit*: the prompt holds a Python file of about 400 tokens and the same file with one change;
  the model writes a third version (coding agents' edits re-emit their context like this);
- *free-form*: an open question, whose answer repeats little of its prompt;
- *8 edits at once*: eight edit requests (eight files) together: total tokens/s.

Tokens/s counts the answer's tokens from the first one to the last (the prompt's prefill is the
same either way and is left out). The answers on and off are checked equal (greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import REPO, cpu_name, publish

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

CODE = '''import math
from dataclasses import dataclass


@dataclass
class Circle:
    """A circle in the plane."""

    x: float
    y: float
    radius: float

    def area(self) -> float:
        return math.pi * self.radius ** 2

    def perimeter(self) -> float:
        return 2 * math.pi * self.radius

    def contains(self, px: float, py: float) -> bool:
        return (px - self.x) ** 2 + (py - self.y) ** 2 <= self.radius ** 2


@dataclass
class Rectangle:
    """An axis-aligned rectangle."""

    x: float
    y: float
    width: float
    height: float

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)

    def contains(self, px: float, py: float) -> bool:
        return self.x <= px <= self.x + self.width and self.y <= py <= self.y + self.height


def total_area(shapes) -> float:
    return sum(shape.area() for shape in shapes)
'''
TRIANGLE = '''

@dataclass
class Triangle:
    """A triangle given by its three corners."""

    a: tuple[float, float]
    b: tuple[float, float]
    c: tuple[float, float]

    def area(self) -> float:
        (ax, ay), (bx, by), (cx, cy) = self.a, self.b, self.c
        return abs((bx - ax) * (cy - ay) - (cx - ax) * (by - ay)) / 2
'''
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NAMES = ["sum_of_areas", "combined_area", "area_total", "all_areas", "areas_sum", "full_area", "shape_area", "net_area"]


def edit_prompt(i: int) -> str:
    """A file, the same file with one change, and the start of a third version with another: the
    model writes the file again (SmolLM2-135M-Instruct asked in chat abbreviates a file instead of
    re-emitting it, so the edit is written as the continuation a base model would complete)."""
    code = CODE.replace("def total_area", TRIANGLE + "\n\ndef total_area").replace("Circle", f"Circle{i}")
    second = code.replace("total_area", NAMES[i])
    return (
        f"# shapes.py, version 1\n{code}\n\n# shapes.py, version 2: total_area renamed to {NAMES[i]}\n{second}\n\n"
        f"# shapes.py, version 3: Rectangle renamed to Box\n"
    )


LONG_FUNCTION = """def parse_config(lines):
    settings = {}
    section = "main"
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            settings.setdefault(section, {})
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = (part.strip() for part in line.split("=", 1))
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif value.isdigit():
            value = int(value)
        settings.setdefault(section, {})[key] = value
    return settings
"""
DOCUMENT = {
    "name": "vllmmlxd",
    "version": "1.4.2",
    "models": [
        {"key": "qwen", "port": 8001, "load": "eager", "max_num_seqs": 8, "cache_memory_mb": 2048},
        {"key": "gemma", "port": 8002, "load": "lazy", "max_num_seqs": 4, "cache_memory_mb": 1024},
        {"key": "llama", "port": 8003, "load": "lazy", "max_num_seqs": 4, "cache_memory_mb": 1024},
    ],
    "gateway": {"port": 8080, "ollama_port": 11434, "rate_limit": "120/minute"},
    "api_keys": {"alice": {"models": ["qwen", "gemma"]}, "bob": {"models": ["llama"]}},
}


def fix_prompt() -> str:
    """A long function, the same with one line fixed, and the start of a third version with another fix."""
    second = LONG_FUNCTION.replace('line.startswith("#")', 'line.startswith(("#", ";"))')
    return (
        f"# config.py, version 1\n{LONG_FUNCTION}\n# config.py, version 2: ';' comments too\n{second}\n"
        "# config.py, version 3: numbers may be negative\n"
    )


def json_prompt() -> str:
    """A JSON document, the same with one field changed, and the start of a third version."""
    first = json.dumps(DOCUMENT, indent=2)
    second = first.replace('"1.4.2"', '"1.4.3"')
    return f"// config.json, version 1\n{first}\n// config.json, version 2: 1.4.3\n{second}\n// config.json, version 3: gemma on port 8012\n"


def stream(url: str, body: dict) -> dict:
    """One streamed request: its chunks' arrival times, its text and its completion tokens."""
    times: list[float] = []
    text = []
    usage: dict = {}
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    body = {**body, "model": "m", "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + path, json=body, timeout=1200) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            if chunk["choices"]:
                piece = chunk["choices"][0].get("delta", {}).get("content") or chunk["choices"][0].get("text")
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
    return {"text": "".join(text), "times": times, "tokens": usage["completion_tokens"]}


def rate(result: dict) -> float:
    """Tokens per second from the first token to the last."""
    return (result["tokens"] - 1) / (result["times"][-1] - result["times"][0])


def together(url: str, bodies: list[dict]) -> tuple[float, list[str]]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: stream(url, b), bodies))
    first = min(r["times"][0] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return tokens / (max(r["times"][-1] for r in results) - first), [r["text"] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--num-draft", type=int, default=8)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--flags", default="", help="more flags for vllmmlxd serve")
    parser.add_argument("--only", help="run only the workloads whose label starts with this")
    args = parser.parse_args()
    flags = ("--speculative", "prompt-lookup", "--num-draft", str(args.num_draft), "--max-num-seqs", "8")
    server = start_serve(args.model, *flags, "--timeout", "1200", *args.flags.split())
    rows = {}
    try:
        url = server.url
        stream(url, {"prompt": "Hello", "max_tokens": 8})  # warm-up
        workloads = {
            "edit (one stream)": {"prompt": edit_prompt(0), "max_tokens": args.tokens},
            "one-line fix in a long function": {"prompt": fix_prompt(), "max_tokens": args.tokens},
            "JSON, one field changed": {"prompt": json_prompt(), "max_tokens": args.tokens},
            "free-form (one stream)": {"messages": [{"role": "user", "content": FREE}], "max_tokens": args.tokens},
        }
        for label, body in workloads.items():
            if args.only and not label.startswith(args.only):
                continue
            on, off = [], []
            for _ in range(args.runs):
                plain = stream(url, {**body, "speculative": False})
                drafted = stream(url, body)
                assert drafted["text"] == plain["text"], f"{label}: the greedy answers differ with speculation"
                on.append(rate(drafted))
                off.append(rate(plain))
            rows[label] = (statistics.median(off), statistics.median(on))
        if not args.only or "8 edits".startswith(args.only):
            edits = [{"prompt": edit_prompt(i), "max_tokens": args.tokens} for i in range(8)]
            off8, texts_off = together(url, [{**b, "speculative": False} for b in edits])
            on8, texts_on = together(url, edits)
            assert texts_on == texts_off, "8 edits: the greedy answers differ with speculation"
            rows["8 edits at once (total)"] = (off8, on8)
        status = httpx.get(url + "/v1/status").json()["speculative"]
    finally:
        server.stop()
    import mlx.core as mx

    lines = [
        "## Speculative decoding: prompt lookup on and off (`bench/speculative.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/speculative.py`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}",
        f'- Model: `{args.model}`, one worker with `--speculative prompt-lookup --num-draft {args.num_draft}` (adaptive); "off" is the same',
        f'  request with `"speculative": false`; greedy, {args.tokens} tokens at most, median of {args.runs}; the answers',
        "  on and off are checked equal",
        "",
        "| workload | off: tokens/s | prompt lookup: tokens/s | ratio |",
        "|---|---|---|---|",
    ]
    for label, (off, on) in rows.items():
        lines.append(f"| {label} | {off:.1f} | {on:.1f} | {on / off:.2f}x |")
    lines += [
        "",
        f"Over the run the worker drafted {status['drafted_tokens']:,} tokens and its model accepted "
        f"{status['accepted_tokens']:,} ({status['acceptance_rate']:.0%}).",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
