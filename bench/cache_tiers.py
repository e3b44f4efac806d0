"""The prefix cache's tiers: time to first token cold, from memory, from disk and after a swap;
the bytes of 8 conversations on one system prompt; kv_bits' bytes and greedy agreement.

    python bench/cache_tiers.py [--model builtin:smollm2-135m-instruct] [--write docs/benchmarks.md]

1. *Tiers*, on the real daemon (one entry, ``cache_disk`` on): a ~2,000-token prompt sent cold,
   then again (memory hit), then after ``vllmmlxctl restart`` (a new worker, empty memory: disk
   hit), then after a reload that swaps the worker (a new-worker key changed). Greedy, streamed
   over HTTP; the time to the first token as the client sees it.
2. *Shared prefix*, ``vllmmlxd serve builtin:tiny``: 8 chat conversations on one 1,500-token system
   prompt; the cache's own byte count (``/v1/status``) after the first and after all 8, with
   blocks and with whole sequences (``--no-use-paged-cache``). Bytes scale with a model's KV per
   token, so the ratios hold for any model.
3. *kv_bits*, in this process on the model: a prompt's KV cut into blocks as the cache stores them
   (float32, 8 bits, 4 bits), bytes per token; then the blocks joined back (dequantized) and 64
   tokens generated greedily from them, against the same from the unquantized KV: the tokens that
   agree position by position, and how many lead before the first difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, publish

sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(Path.home() / ".local/state/vllmmlxd"))

from tests.support.daemon import free_port, make_daemon
from tests.support.servers import greedy_completion, start_serve

LONG = "The shelves. " + " ".join(f"Rule {i}: item {i} is on shelf {i % 7}." for i in range(127))
SYSTEM = " ".join(f"Rule {i}: item {i} is on shelf {i % 7}." for i in range(118))
AGREEMENT_PROMPTS = [
    "Summarise the rules above in three sentences, then list the shelves that hold an even item.",
    "Write a short story about a librarian who loses item 42, in the style of a fairy tale.",
    "Explain, step by step, how you would find item 77 on these shelves.",
]


def first_token(url: str, prompt: str) -> tuple[float, str]:
    return greedy_completion(url, prompt, timeout=900)


def status(url: str) -> dict:
    return httpx.get(url + "/v1/status", timeout=30).json()


def tiers(model: str) -> list[tuple[str, float, int, dict]]:
    """(step, TTFT seconds, prompt tokens served by the cache, the disk block of /v1/status)."""
    d = make_daemon()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    entry = {"model": model, "port": port, "cache_disk": {"dir": str(d.dir / "kv"), "budget_gb": 2}}
    d.write({"m": entry})
    d.start()
    out = []
    try:
        d.wait_ready({"m"}, timeout=600)

        def measure(step: str) -> None:
            before = status(url)["cache"]["cached_tokens"]
            ttft, _ = first_token(url, LONG)
            cache = status(url)["cache"]
            out.append((step, ttft, cache["cached_tokens"] - before, cache["disk"]))
            print(step, round(ttft, 3), out[-1][2], file=sys.stderr)

        measure("cold")
        time.sleep(2)  # the writer thread writes the blocks meanwhile
        measure("memory hit")
        pid = d.models()["m"]["pid"]
        assert d.ctl("restart", "m").returncode == 0
        d.wait_for(lambda ms: ms["m"]["pid"] != pid and ms["m"]["state"] == "ready", 300, "restart")
        measure("disk hit (after a restart)")
        pid = d.models()["m"]["pid"]
        d.write({"m": {**entry, "prefill_step_size": 500}})
        d.wait_for(lambda ms: ms["m"]["pid"] not in (None, pid) and ms["m"]["state"] == "ready", 300, "swap")
        measure("after a swap (reload, new worker)")
    finally:
        d.stop()
        shutil.rmtree(d.dir, ignore_errors=True)
    return out


def shared_prefix() -> dict[str, tuple[int, int]]:
    """Bytes after one conversation and after eight, with blocks and with whole sequences."""
    out = {}
    for label, flags in (
        ("blocks (use_paged_cache: true)", ()),
        ("whole sequences (false)", ("--no-use-paged-cache",)),
    ):
        s = start_serve("builtin:tiny", "--timeout", "300", *flags)
        try:
            sizes = []
            for i in range(8):
                r = httpx.post(
                    s.url + "/v1/chat/completions",
                    json={
                        "messages": [
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"Where is item {i}?"},
                        ],
                        "max_tokens": 6,
                        "temperature": 0,
                    },
                    timeout=300,
                )
                r.raise_for_status()
                sizes.append(status(s.url)["cache"]["memory_bytes"])
            out[label] = (sizes[0], sizes[-1])
        finally:
            s.stop()
    return out


def kv_bits(model: str, tokens: int = 64) -> tuple[dict, list[tuple[int, int]], int]:
    """Bytes per token at each precision; per prompt (positions agreeing, leading tokens agreeing)."""
    from vllmmlxd.runtime.blas import activate

    activate("auto", os.cpu_count() or 1)
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from vllmmlxd.engine.cache.kv import BlockKV
    from vllmmlxd.engine.loading.loader import load_model
    from vllmmlxd.paths import resolve_state_dir

    loaded = load_model(model, resolve_state_dir())
    per_token: dict = {}
    agreement = []
    length = 0
    for question in AGREEMENT_PROMPTS:
        messages = [{"role": "system", "content": SYSTEM[:2500]}, {"role": "user", "content": question}]
        prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        length = len(prompt)
        cache = make_prompt_cache(loaded.model)
        loaded.model(mx.array([prompt[:-1]]), cache=cache)  # the prefix the cache would hold
        mx.eval([c.keys for c in cache])
        spans = [(s, min(s + 32, len(prompt) - 1)) for s in range(0, len(prompt) - 1, 32)]
        runs = {}
        for bits in (None, 8, 4):
            ops = BlockKV(bits=bits)
            blocks = ops.cut(cache, spans)
            per_token[bits] = sum(ops.nbytes(b) for b in blocks) / (len(prompt) - 1)
            joined = ops.join(blocks, len(prompt) - 1)
            out = []
            for token, _ in generate_step(mx.array(prompt[-1:]), loaded.model, max_tokens=tokens, prompt_cache=joined):
                out.append(int(token))
            runs[bits] = out
        same = sum(a == b for a, b in zip(runs[None], runs[8]))
        lead = next((i for i, (a, b) in enumerate(zip(runs[None], runs[8])) if a != b), tokens)
        agreement.append((same, lead))
        print("kv_bits 8 agreement", same, lead, file=sys.stderr)
    return per_token, agreement, length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--write", type=Path, help="replace this benchmark's section of a markdown file")
    args = parser.parse_args()

    # kv_bits runs MLX in this process: in a child, so the daemon's workers get the cores alone later.
    child = subprocess.run(
        [sys.executable, "-c", _KV_CHILD, args.model],
        capture_output=True,
        text=True,
        cwd=REPO / "bench",
    )
    if child.returncode != 0:
        raise SystemExit(child.stderr[-3000:])
    per_token, agreement, length = json.loads(child.stdout.strip().splitlines()[-1])
    shared = shared_prefix()
    measured = tiers(args.model)

    import mlx.core as mx

    cold = measured[0][1]
    lines = [
        "## Prefix cache tiers: cold, memory, disk, after a swap; shared prefixes; kv_bits (`bench/cache_tiers.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/cache_tiers.py --model {args.model}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__}",
        f"- Model: `{args.model}` (float32 on this CPU); blocks of 32 tokens",
        "",
        f"Time to first token of a {LONG.count('Rule')}-rule prompt (~1,950 tokens), streamed, 8 tokens greedy:",
        "",
        "| step | TTFT | vs cold | prompt tokens from the cache | blocks read from disk |",
        "|---|---|---|---|---|",
    ]
    for step, ttft, served, disk in measured:
        lines.append(f"| {step} | {ttft * 1000:.0f} ms | {ttft / cold:.3f}x | {served} | {disk['blocks_read']} |")
    lines += [
        "",
        "Bytes of KV the prefix cache holds for 8 chat conversations on one ~1,500-token system prompt"
        " (`builtin:tiny`, 512 bytes of KV a token; `memory_bytes` of `/v1/status`):",
        "",
        "| cache | after 1 | after 8 | 8 vs 1 |",
        "|---|---|---|---|",
    ]
    for label, (one, eight) in shared.items():
        lines.append(f"| {label} | {one / 1024:.0f} KiB | {eight / 1024:.0f} KiB | {eight / one:.2f}x |")
    plain = per_token["none"]
    lines += [
        "",
        f"`kv_bits` on `{args.model}`: KV bytes a token as the cache holds it, and {64}-token greedy answers"
        f" generated from a prompt's KV (~{length} tokens) held quantized against held as computed:",
        "",
        "| kv_bits | bytes a token | vs unquantized |",
        "|---|---|---|",
        f"| none (float32) | {plain:.0f} | 1.00x |",
        f"| 8 | {per_token['8']:.0f} | {per_token['8'] / plain:.2f}x |",
        f"| 4 | {per_token['4']:.0f} | {per_token['4'] / plain:.2f}x |",
        "",
        "| prompt | tokens agreeing (of 64) | identical until |",
        "|---|---|---|",
    ]
    for question, (same, lead) in zip(AGREEMENT_PROMPTS, agreement):
        lines.append(f"| {question[:48]}... | {same} | {lead} |")
    publish(lines, args.write)


# The kv_bits measurement, run as a child process (argv[1]: the model); prints one JSON line.
_KV_CHILD = """
import json, sys
sys.path.insert(0, ".")
import cache_tiers
per_token, agreement, length = cache_tiers.kv_bits(sys.argv[1])
print(json.dumps([{("none" if k is None else str(k)): v for k, v in per_token.items()}, agreement, length]))
"""


if __name__ == "__main__":
    main()
