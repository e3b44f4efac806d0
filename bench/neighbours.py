"""Decoding beside noisy neighbours: one stream and 16 at once, on a quiet machine and beside busy processes.

    python bench/neighbours.py [--model builtin:smollm2-135m-instruct] [--servers default,threads-1,...]
                               [--tokens 64] [--write docs/benchmarks.md]

A Linux box that serves models usually runs other work too. Each server below is started in
turn on the same model folder and measured quiet, then beside one busy-looping process per core
(plain `while True: pass`, at the same priority), then quiet again is not needed: the busy phase
comes second so a server's caches are as warm in both.

Per phase, streamed /v1/completions at temperature 0:
- single: one request of --tokens tokens, its tokens/s;
- 16-way: 16 requests of --tokens tokens at once, their total tokens/s, and how many failed
  (an error or no answer within 300 s).

Servers (`--servers`, comma-separated):
- default: `vllmmlxd serve MODEL` with no thread or BLAS flag, as a user runs it;
- threads-N: the same with `--threads N`;
- all-cores: `--threads` set to every core (the default before this benchmark chose one);
- mlx-lm: `python -m mlx_lm server`, on the BLAS library vllmmlxd's default picks (LD_PRELOAD),
  with that library's own default threading (every core), as a user who preloads it would run it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, cpu_name, write_section
from peers import Client, Contender, launch, peer_blas_env, reported_blas, stop, wait_healthy

sys.path.insert(0, str(REPO))

SECTION = "## Noisy neighbours: decoding beside busy processes (`bench/neighbours.py`)"
PROMPT = "Write a long story about a lighthouse keeper."
WAY = 16
REQUEST_TIMEOUT = 300.0


def prepare(model: str) -> dict:
    """The model's folder and the BLAS library a default worker picks (in a child: mlx is not loaded here)."""
    code = (
        "import json, os, sys\n"
        "from vllmmlxd.runtime.blas import activate\n"
        "active = activate('auto', os.cpu_count() or 1)  # before mlx loads, as a worker does\n"
        "from vllmmlxd.engine.loading.loader import resolve_spec\n"
        "from vllmmlxd.paths import resolve_state_dir\n"
        "from tokenizers import Tokenizer\n"
        "folder = resolve_spec(sys.argv[1], resolve_state_dir())[0]\n"
        "tok = Tokenizer.from_file(str(folder / 'tokenizer.json'))\n"
        "eos = sorted({t for t in (tok.token_to_id(s) for s in ('<|endoftext|>', '<|im_end|>', '</s>')) if t is not None})\n"
        "print(json.dumps({'folder': str(folder), 'blas': active.info.as_dict(), 'eos': eos}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def contenders(names: list[str], blas: dict) -> list[tuple[str, Contender]]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    serve = [sys.executable, "-m", "vllmmlxd.cli", "serve", "{folder}", "--port", "{port}", "--timeout", "600"]
    out = []
    for name in names:
        if name == "default":
            out.append(("vllmmlxd, defaults", Contender(name, serve, ignore_eos=True)))
        elif name == "all-cores":
            out.append(
                (f"vllmmlxd --threads {cores}", Contender(name, [*serve, "--threads", str(cores)], ignore_eos=True))
            )
        elif name.startswith("env-"):  # env-KEY=VALUE: the default worker with one more variable
            key, _, value = name[4:].partition("=")
            out.append((f"vllmmlxd, {key}={value}", Contender(name, serve, {key: value}, ignore_eos=True)))
        elif name.startswith("threads-"):
            n = name.split("-", 1)[1]
            out.append((f"vllmmlxd --threads {n}", Contender(name, [*serve, "--threads", n], ignore_eos=True)))
        elif name == "mlx-lm":
            env = peer_blas_env({**blas, "threads": cores})
            for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS"):
                env.pop(key, None)  # the library's own default threading
            argv = [sys.executable, "-m", "mlx_lm", "server", "--model", "{folder}", "--port", "{port}"]
            out.append(("mlx_lm.server", Contender(name, argv, env)))
        else:
            raise SystemExit(f"unknown server {name!r}")
    return out


class Neighbours:
    """One busy-looping process per core, while the block runs."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(1.0)  # the scheduler sees them running before the first request
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


async def single(client: Client, tokens: int) -> dict:
    reply = await asyncio.wait_for(client.complete(PROMPT, tokens), REQUEST_TIMEOUT)
    return {"tps": reply.tokens / reply.latency, "failed": 0}


async def many(client: Client, tokens: int) -> dict:
    started = time.perf_counter()
    replies = await asyncio.gather(
        *(asyncio.wait_for(client.complete(PROMPT, tokens), REQUEST_TIMEOUT) for _ in range(WAY)),
        return_exceptions=True,
    )
    elapsed = time.perf_counter() - started
    done = [r for r in replies if not isinstance(r, BaseException)]
    return {"tps": sum(r.tokens for r in done) / elapsed, "failed": WAY - len(done)}


async def measure(url: str, model: str, ignore_eos: bool, tokens: int, cores: int, eos: list[int]) -> dict:
    # A server without ignore_eos is kept from ending early by a bias against the end tokens.
    client = Client(url, model, ignore_eos, None if ignore_eos else {"logit_bias": {str(t): -100 for t in eos}})
    out: dict = {}
    try:
        await client.complete(PROMPT, 8)  # warm-up
        for phase in ("quiet", "busy"):
            with Neighbours(cores if phase == "busy" else 0):
                for kind, run in (("single", single), ("16-way", many)):
                    started = time.perf_counter()
                    try:
                        out[(phase, kind)] = await run(client, tokens)
                    except Exception as exc:
                        out[(phase, kind)] = {"tps": 0.0, "failed": 1 if kind == "single" else WAY, "error": repr(exc)}
                    r = out[(phase, kind)]
                    print(
                        f"    {phase} {kind}: {r['tps']:.1f} tok/s, {r['failed']} failed "
                        f"({time.perf_counter() - started:.0f} s)",
                        file=sys.stderr,
                    )
    finally:
        await client.close()
    return out


def render(rows: dict, args, blas: dict, cores: int) -> str:
    import mlx.core as mx  # only for its version and device

    lines = [
        SECTION,
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/neighbours.py {' '.join(sys.argv[1:])}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {cores} cores, MLX {mx.__version__} "
        f"on {mx.default_device()}",
        f"- Model: `{args.model}`; greedy, {args.tokens} tokens a request; busy: {cores} processes running "
        f"`while True: pass` beside the server; a request failed if it erred or had no answer in {REQUEST_TIMEOUT:.0f} s",
        f"- mlx_lm.server runs with `LD_PRELOAD` of {blas['name']} (what `auto` picked as the run started) and "
        "that library's own threading. It runs the checkpoint's float16 weights as they are, and MLX's CPU "
        "backend computes float16 products itself, not through the BLAS: vllmmlxd loads half-precision "
        "weights as float32 on the CPU for that reason (engine/loading/loader.py), which is most of the gap between them",
        "",
        "| server | single, quiet | single, busy | ratio | 16-way, quiet | 16-way, busy | ratio | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        if "error" in r and not any(isinstance(k, tuple) for k in r):
            lines.append(f"| {label} | {r['error']} | | | | | | |")
            continue
        cells = [f"{label}: {r['blas']}" if "blas" in r else label]
        for kind in ("single", "16-way"):
            quiet, busy = r[("quiet", kind)]["tps"], r[("busy", kind)]["tps"]
            cells += [f"{quiet:.1f}", f"{busy:.1f}", f"{busy / quiet:.2f}x" if quiet else "-"]
        cells.append(str(sum(v["failed"] for k, v in r.items() if isinstance(k, tuple))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--servers", default="default,all-cores,mlx-lm")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file's section")
    args = parser.parse_args()
    prep = prepare(args.model)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rows: dict = {}
    for label, c in contenders(args.servers.split(","), prep["blas"]):
        print(f"{label}", file=sys.stderr)
        running = launch(c, prep["folder"])
        try:
            wait_healthy(running.url, running.proc, running.log, timeout=600)
            blas_used = reported_blas(running.url)  # vllmmlxd says which library and threads it runs
            model = prep["folder"] if c.key == "mlx-lm" else "m"  # mlx_lm.server loads what a request names
            rows[label] = asyncio.run(measure(running.url, model, c.ignore_eos, args.tokens, cores, prep["eos"]))
            if blas_used:
                rows[label]["blas"] = blas_used
        except Exception as exc:
            rows[label] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            stop(running)
    text = render(rows, args, prep["blas"], cores)
    print(text)
    if args.write:
        write_section(args.write, SECTION, text)


if __name__ == "__main__":
    main()
