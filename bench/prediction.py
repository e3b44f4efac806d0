"""Predicted outputs: tokens/s of an edit with and without a prediction, side by side, on one worker.

    python bench/prediction.py [--model builtin:smollm2-135m-instruct] [--runs 3] [--write docs/benchmarks.md]

One `vllmmlxd serve MODEL` worker (prompt lookup on, adaptive, as users run it). The request is an
edit as editors send one with a prediction: chat, "rename this identifier in this file", greedy,
streamed over HTTP, sent interleaved:

- *off*: `"speculative": false`, no prediction;
- *prompt lookup*: the entry's speculation, no prediction;
- *prediction = the answer*: `prediction: {type: content, content: <the greedy answer>}`, the
  best case an editor gets when its guess is right;
- *prediction = the file*: the file before the edit, what an editor sends in practice.

Tokens/s counts the answer's tokens from the first to the last; every answer is checked equal to
the one without a prediction (greedy), and the accepted and rejected prediction tokens are
read from the usage.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, publish
from speculative import CODE

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

ASK = "Rename the function total_area to sum_of_areas in this file. Answer with the whole file only.\n\n"


def chat(url: str, body: dict) -> dict:
    """One streamed chat request: its text, chunk times and usage."""
    times, text, usage = [], [], {}
    body = {"model": "m", "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **body}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1200) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
                text.append(chunk["choices"][0]["delta"]["content"])
    return {"text": "".join(text), "times": times, "usage": usage}


def rate(result: dict) -> float:
    return (result["usage"]["completion_tokens"] - 1) / (result["times"][-1] - result["times"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    server = start_serve(args.model, "--timeout", "1200")
    messages = [{"role": "user", "content": ASK + CODE}]
    base = {"messages": messages, "max_tokens": args.tokens}
    rows: dict[str, list[float]] = {}
    counts: dict[str, tuple[int, int]] = {}
    try:
        url = server.url
        chat(url, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})  # warm-up
        answer = chat(url, {**base, "speculative": False})["text"]
        variants = {
            "off": {"speculative": False},
            "prompt lookup": {},
            "prediction = the answer": {"prediction": {"type": "content", "content": answer}},
            "prediction = the file": {"prediction": {"type": "content", "content": CODE}},
        }
        for _ in range(args.runs):
            for label, extra in variants.items():
                got = chat(url, {**base, **extra})
                assert got["text"] == answer, f"{label}: the greedy answer differs"
                rows.setdefault(label, []).append(rate(got))
                details = got["usage"].get("completion_tokens_details") or {}
                counts[label] = (
                    details.get("accepted_prediction_tokens", 0),
                    details.get("rejected_prediction_tokens", 0),
                )
        tokens = chat(url, {**base, "speculative": False})["usage"]["completion_tokens"]
    finally:
        server.stop()
    import mlx.core as mx

    off = statistics.median(rows["off"])
    lines = [
        "## Predicted outputs: an edit with and without a prediction (`bench/prediction.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/prediction.py`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}",
        f"- Model: `{args.model}`, one worker (prompt lookup on, adaptive); chat, greedy, an edit of a {len(CODE)}-character",
        f"  Python file answered in {tokens} tokens; median of {args.runs}, interleaved; every answer checked equal",
        "",
        "| request | tokens/s | vs off | prediction tokens accepted / rejected |",
        "|---|---|---|---|",
    ]
    for label, rates in rows.items():
        value = statistics.median(rates)
        accepted, rejected = counts[label]
        said = f"{accepted} / {rejected}" if label.startswith("prediction") else "-"
        lines.append(f"| {label} | {value:.1f} | {value / off:.2f}x | {said} |")
    publish(lines, args.write)


if __name__ == "__main__":
    main()
