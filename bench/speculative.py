"""Speculative decoding: tokens/s with prompt lookup on and off, side by side, on one worker.

    python bench/speculative.py [--model builtin:smollm2-135m-instruct] [--runs 2] [--write docs/benchmarks.md]

One `vllmmlxd serve MODEL --speculative prompt-lookup` worker (adaptive, as users run it); each
measurement sends the same requests with speculation on and with it off for the request
(`"speculative": false`), interleaved, greedy, streamed over HTTP:

- *edit*: the prompt holds about 400 tokens of Python; the model is asked to write the file
  again with one function renamed (coding agents' edits re-emit their context like this);
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

from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve  # noqa: E402

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
EDIT = "Here is a Python file:\n\n```python\n{code}```\n\nWrite the whole file again, with the function total_area renamed to {name}. Output only the code."
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NAMES = ["sum_of_areas", "combined_area", "area_total", "all_areas", "areas_sum", "full_area", "shape_area", "net_area"]


def stream(url: str, content: str, max_tokens: int, speculative: bool) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "speculative": speculative}
    times: list[float] = []
    text = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1200) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
                    text.append(chunk["choices"][0]["delta"]["content"])
    return {"text": "".join(text), "times": times}


def measure(url: str, content: str, max_tokens: int, on: bool) -> tuple[float, str]:
    r = stream(url, content, max_tokens, on)
    tokens = count(url, r["text"])
    return tokens / (r["times"][-1] - r["times"][0]), r["text"]


def count(url: str, text: str) -> int:
    """The answer's tokens, as the worker counts a prompt of that text (less the template's own)."""
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    empty = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": ""}]}
    n = httpx.post(url + "/v1/messages/count_tokens", json=body).json()["input_tokens"]
    return n - httpx.post(url + "/v1/messages/count_tokens", json=empty).json()["input_tokens"]


def together(url: str, contents: list[str], max_tokens: int, on: bool) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(contents)) as pool:
        results = list(pool.map(lambda c: stream(url, c, max_tokens, on), contents))
    first = min(r["times"][0] for r in results)
    return sum(count(url, r["text"]) for r in results) / (max(r["times"][-1] for r in results) - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    server = start_serve(args.model, "--speculative", "prompt-lookup", "--timeout", "1200", "--max-num-seqs", "8")
    rows = {}
    try:
        url = server.url
        stream(url, "Hello", 8, True)  # warm-up
        edit = EDIT.format(code=CODE, name=NAMES[0])
        for label, content in (("edit", edit), ("free-form", FREE)):
            on, off = [], []
            for _ in range(args.runs):
                rate_off, text_off = measure(url, content, args.tokens, False)
                rate_on, text_on = measure(url, content, args.tokens, True)
                assert text_on == text_off, f"{label}: the greedy answers differ with speculation"
                on.append(rate_on)
                off.append(rate_off)
            rows[label] = (statistics.median(off), statistics.median(on))
        edits = [EDIT.format(code=CODE.replace("Circle", f"Circle{i}"), name=NAMES[i]) for i in range(8)]
        off8 = together(url, edits, args.tokens, False)
        on8 = together(url, edits, args.tokens, True)
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
        f"- Model: `{args.model}`, one worker with `--speculative prompt-lookup` (adaptive); \"off\" is the same",
        f"  request with `\"speculative\": false`; greedy, {args.tokens} tokens at most, median of {args.runs}; the answers",
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
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_section(args.write, lines[0], text)


if __name__ == "__main__":
    main()
