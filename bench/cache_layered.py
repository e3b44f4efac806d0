"""The prefix cache of models that are not all attention: time to first token of a resend, an
agent's next turn and a new chat on the same system prompt, from memory and after a restart from
disk, against the same prompts cold; what a checkpoint costs.

    python bench/cache_layered.py [--write docs/benchmarks.md]

Two random-weight models made with mlx-lm's own classes in float32 (see ``PRECISION``;
tests/support/families.py at a larger size: 8 layers, 256 wide, builtin:tiny's 49,152-token
vocabulary): a Qwen3.5-shaped one (6 gated-delta layers, 2 attention) and a Gemma-3-shaped one
(6 sliding-window layers of 512 tokens, 2 global). On the real daemon, each model twice: with
the prefix cache and its disk tier, and with no cache (the cold side, same machine, same run).
Requests are chat completions, greedy: one token asked (its time is the time to first token as
the client sees it), then the same request for 16 tokens, whose answer is compared with cold's.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import httpx
from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(Path.home() / ".local/state/vllmmlxd"))

from tests.e2e.test_daemon_cache_layered import FIRST, OTHER
from tests.support.daemon import free_port, make_daemon
from tests.support.families import save

# float32: MLX's CPU backend runs 4-bit matrices with bfloat16 activations ~35x slower than float32
# ones through the BLAS (a 512-token prefill of these models: 22 s against 0.67 s), which a Mac's
# GPU does not; the cache's gain is the same fraction of a prefill either way.
PRECISION = "float32"

SIZES = {
    "qwen3_5": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, linear_num_value_heads=4, linear_num_key_heads=2,
                    linear_key_head_dim=32, linear_value_head_dim=32, full_attention_interval=4),
    "gemma3_text": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64, sliding_window=512,
                        sliding_window_pattern=4),
}  # fmt: skip


def chat(url: str, messages: list[dict], max_tokens: int = 16) -> tuple[float, str, int, int]:
    """(seconds, text, prompt tokens, prompt tokens from the cache) of a greedy chat: with
    ``max_tokens: 1`` its time is the time to its first token as the client sees it."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=900)
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    text = r.json()["choices"][0]["message"]["content"] or ""
    return took, text, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def measured(url: str, messages: list[dict]) -> tuple[float, str, int, int]:
    """A request's time to first token and cached tokens (one token asked), then its 16-token answer."""
    ttft, _, tokens, cached = chat(url, messages, max_tokens=1)
    return ttft, chat(url, messages)[1], tokens, cached


def run(family: str, folder: Path) -> tuple[list[tuple], dict]:
    from vllmmlxd.engine.loading.builtin import ensure_builtin

    d = make_daemon()
    path = str(
        save(family, PRECISION, folder / family, tokenizer_from=ensure_builtin("tiny", d.state_dir), **SIZES[family])
    )
    ports = {"cached": free_port(), "cold": free_port()}
    entries = {
        "cached": {"model": path, "port": ports["cached"], "cache_disk": {"dir": str(d.dir / "kv"), "budget_gb": 4}},
        "cold": {"model": path, "port": ports["cold"], "cache_memory_mb": 0},
    }
    d.write(entries)
    d.start()
    rows = []
    try:
        d.wait_ready(set(entries), timeout=900)
        url = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
        _, answer, _, _ = chat(url["cached"], FIRST)
        turn = [*FIRST, {"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks. And item 41?"}]
        asks = [("resend", FIRST), ("next turn", turn), ("new chat, same system prompt", OTHER)]
        cold = {what: measured(url["cold"], messages) for what, messages in asks}
        for when in ("memory", "disk (after vllmmlxctl restart)"):
            if when.startswith("disk"):
                time.sleep(3)  # the disk writer catches up
                pid = d.models()["cached"]["pid"]
                assert d.ctl("restart", "cached").returncode == 0
                d.wait_for(lambda ms: ms["cached"]["pid"] not in (None, pid) and ms["cached"]["state"] == "ready",
                           600, "restart")  # fmt: skip
            for what, messages in asks:
                ttft, text, tokens, cached = measured(url["cached"], messages)
                c_ttft, c_text, _, _ = cold[what]
                rows.append((what, when, tokens, cached, ttft, c_ttft, text == c_text))
                print(family, rows[-1], file=sys.stderr)
        status = httpx.get(url["cached"] + "/v1/status", timeout=30).json()
        return rows, {"cache": status["cache"], "layout": status["layout"]}
    finally:
        d.stop()
        shutil.rmtree(d.dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, help="replace this benchmark's section of a markdown file")
    args = parser.parse_args()
    folder = Path(os.environ["VLLMMLXD_STATE_DIR"]) / "bench-models"
    import mlx.core as mx

    lines = [
        "## Prefix cache of hybrid and sliding-window models (`bench/cache_layered.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/cache_layered.py`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__}",
        "- Models: random weights, mlx-lm's own classes, float32 (4-bit runs ~35x slower on this CPU backend), 8 layers x 256, "
        "49,152-token vocabulary: Qwen3.5-shaped (6 gated-delta + 2 attention layers), Gemma-3-shaped "
        "(6 sliding-window layers of 512 tokens + 2 global). Greedy; TTFT: a 1-token request's time.",
        "- Cold: the same prompt on the same model with no cache, in the same run.",
        "",
    ]
    for family, label in (("qwen3_5", "Qwen3.5-shaped (checkpoints)"), ("gemma3_text", "Gemma-3-shaped (windows)")):
        rows, status = run(family, folder)
        cache = status["cache"]
        lines += [
            f"**{label}**: prefix cache `{cache['holds']}`",
            "",
            "| request | from | prompt tokens | from the cache | TTFT | cold TTFT | vs cold | same answer as cold |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for what, when, tokens, cached, ttft, cold, same in rows:
            lines.append(
                f"| {what} | {when} | {tokens:,} | {cached:,} ({cached / tokens:.0%}) | {ttft:.3f} s | "
                f"{cold:.3f} s | {ttft / cold:.2f}x | {'yes' if same else 'NO'} |"
            )
        lines.append("")
        if cache.get("checkpoints") is not None:
            lines.append(
                f"Checkpoints: {cache['checkpoints']} held at the end, {cache['checkpoint_bytes'] / 1024**2:.2f} MB each "
                f"(every recurrent layer's state, one row); the cache held {cache['memory_mb']:.1f} MB in all for "
                f"{cache['tokens']:,} tokens of blocks."
            )
        else:
            lines.append(
                f"Blocks hold the windowed layers' KV beside the global layers': {cache['kv_bytes_per_token']:,} "
                f"bytes a token in all ({cache['memory_mb']:.1f} MB for {cache['tokens']:,} tokens)."
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section(args.write, lines[0], text)


if __name__ == "__main__":
    main()
