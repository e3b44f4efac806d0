"""What keeping each key's prefix cache apart costs: a ~1,500-token system prompt sent by two keys,
the second key's time to first token with ``cache_scope: key`` (the default: it prefills the system
prompt again) and ``cache_scope: entry`` (it reuses the first key's).

    python bench/cache_scope.py [--model builtin:smollm2-135m-instruct] [--write docs/benchmarks.md]

One ``vllmmlxd serve`` worker, given two named keys the way the daemon gives them (pushed over
its private socket), the scope changed live between the two runs; each run's conversations are
new to the cache. Greedy, one token asked: a request's time is its time to first token.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, publish

sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(Path.home() / ".local/state/vllmmlxd"))

from tests.support.servers import free_port, start_serve
from vllmmlxd.config.load import parse_config
from vllmmlxd.supervisor.live import push_settings

KEYS = {"alice": "alice-bench-k3y", "bob": "bob-bench-k3y"}
SYSTEM = " ".join(f"Rule {i}: item {i} is on shelf {i % 7}." for i in range(118))  # ~1,500 tokens


def settings(model: str, port: int, scope: str):
    keys = "\n".join(f"  {name}: {{key: {key}}}" for name, key in KEYS.items())
    text = f"api_keys:\n{keys}\nmodels:\n  m: {{model: '{model}', port: {port}, api_keys: [alice, bob], cache_scope: {scope}}}\n"
    return parse_config(text).config.models["m"]


def ask(url: str, key: str, system: str, question: str) -> tuple[float, int, int]:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 1, "temperature": 0}  # fmt: skip
    started = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=900)
    took = time.perf_counter() - started
    r.raise_for_status()
    usage = r.json()["usage"]
    return took, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--write", type=Path, help="replace this benchmark's section of a markdown file")
    args = parser.parse_args()
    sock = Path(tempfile.mkdtemp(prefix="vllmmlxd-scope-")) / "w.sock"
    port = free_port()
    server = start_serve(args.model, "--health-socket", str(sock), "--timeout", "900", port=port, threads=None)
    rows = []
    try:
        for n, scope in enumerate(("key", "entry")):
            ok, detail = asyncio.run(push_settings(sock, settings(args.model, port, scope)))
            assert ok, detail
            system = f"Session {n}. {SYSTEM}"  # new to the cache in each run
            first = ask(server.url, KEYS["alice"], system, "Where is item 3?")
            second = ask(server.url, KEYS["bob"], system, "Where is item 4?")
            rows.append((scope, first, second))
            print(scope, first, second, file=sys.stderr)
    finally:
        server.stop()
    import mlx.core as mx

    lines = [
        "## What per-key prefix-cache isolation costs (`bench/cache_scope.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/cache_scope.py --model {args.model}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__}",
        "- One worker, two named keys; a system prompt new to the cache in each run, sent by alice, then by bob with"
        " another question. Greedy, one token asked: the time is the time to first token.",
        "",
        "| `cache_scope` | alice: prompt tokens, cached, TTFT | bob: prompt tokens, cached, TTFT | bob vs alice |",
        "|---|---|---|---|",
    ]
    for scope, (a_s, a_n, a_c), (b_s, b_n, b_c) in rows:
        lines.append(f"| {scope} | {a_n:,}, {a_c:,}, {a_s:.2f} s | {b_n:,}, {b_c:,}, {b_s:.2f} s | {b_s / a_s:.2f}x |")
    publish(lines, args.write)


if __name__ == "__main__":
    main()
