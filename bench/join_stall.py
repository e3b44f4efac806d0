"""The stall a running stream sees while a long prompt joins the batch.

    python bench/join_stall.py [--model builtin:smollm2-135m-instruct] [--prompt-tokens 2000] [--runs 2]

One `vllmmlxd serve` worker. A stream generates (greedy, `ignore_eos`); once it is decoding, a
request with a prompt of about --prompt-tokens arrives (a new one each run: cold). The stream's
gaps between tokens, from when the prompt arrives until its last token (its chunks, its join
into the batch, the step that stores it in the prefix cache): the worst against the median of
the stream's gaps before it arrived. The stream is ended ten tokens after the prompt's first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx
from common import REPO

sys.path.insert(0, str(REPO))

from tests.support.servers import start_serve

WORDS = [
    "the",
    "river",
    "keeps",
    "its",
    "own",
    "time",
    "and",
    "the",
    "town",
    "beside",
    "it",
    "learns",
    "the",
    "tides",
    "by",
    "heart",
]


def long_prompt(tokens: int, run: int) -> str:
    """About ``tokens`` tokens, different for each ``run`` from its start: every run's prompt is cold."""
    words = (WORDS[i % len(WORDS)] + (str(i) if i % 7 == 0 else "") for i in range(int(tokens * 0.75)))
    return f"Run {run}. " + " ".join(words)


def stream_times(url: str, body: dict, out: list[float], first: threading.Event | None = None, until=None) -> None:
    """Append each text chunk's arrival to ``out``; ``until()`` true ends the stream there (a cancel)."""
    body = {**body, "model": "m", "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=1200) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0].get("text"):
                    out.append(time.perf_counter())
                    if first is not None:
                        first.set()
                    if until is not None and until():
                        break


def measure(url: str, prompt_tokens: int, run: int) -> dict:
    running: list[float] = []
    joined: list[float] = []
    stream = threading.Thread(
        target=stream_times,
        args=(url, {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}, running),
        # It streams until the long prompt's first token, and ten tokens more.
        kwargs={"until": lambda: bool(joined) and sum(t > joined[0] for t in running) >= 10},
    )
    stream.start()
    while len(running) < 30:
        time.sleep(0.05)
    arrived = time.perf_counter()
    done = threading.Event()
    joiner = threading.Thread(
        target=stream_times, args=(url, {"prompt": long_prompt(prompt_tokens, run), "max_tokens": 4}, joined, done)
    )
    joiner.start()
    joiner.join()
    stream.join()
    before = [b - a for a, b in zip(running, running[1:]) if b < arrived]
    # From its arrival to its last token: the join, and the step that stores it in the prefix cache.
    during = [b - a for a, b in zip(running, running[1:]) if b >= arrived and a <= joined[-1]]
    return {
        "median": statistics.median(before[5:]),
        "worst": max(during),
        "ttft": joined[0] - arrived,
        "during": during,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--flags", default="", help="more flags for vllmmlxd serve")
    parser.add_argument("--gaps", action="store_true", help="print every gap while the prompt joins (ms)")
    args = parser.parse_args()
    server = start_serve(args.model, "--timeout", "1200", *args.flags.split())
    try:
        results = [measure(server.url, args.prompt_tokens, run) for run in range(args.runs)]
    finally:
        server.stop()
    for r in results:
        print(
            f"median gap {r['median'] * 1000:.0f} ms, worst while joining {r['worst'] * 1000:.0f} ms "
            f"({r['worst'] / r['median']:.1f}x), the prompt's first token after {r['ttft']:.1f} s"
        )
        if args.gaps:
            print(" ".join(f"{g * 1000:.0f}" for g in r["during"]))


if __name__ == "__main__":
    main()
