"""The decode step with and without `mx.compile` of the per-token work around the matrix products.

    python bench/compile_step.py [--model builtin:smollm2-135m-instruct] [--batch 1,16] [--steps 60] [--rounds 3]

One process, the engine's own BatchGenerator on the model a worker would load (same BLAS and
threads as `vllmmlxd serve`'s default). For each batch size, the median time of a decode step
(`BatchGenerator.next()`, greedy) in each variant, the variants interleaved round by round so
the machine's drift hits them alike:

- eager: as the engine runs it;
- compiled MLP: each layer's feed-forward block (norm, gate, up, activation, down, residual)
  traced once per batch size by `mx.compile` and fused;
- compiled sampling: the step's log-softmax and greedy pick compiled.

The attention half of a layer cannot be compiled as it is written: its KV cache grows by one
position a step, so its shapes change every step (mx.compile would trace again each time).
The greedy outputs of every variant are checked equal to the eager ones.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

from common import REPO, cpu_name, write_section

sys.path.insert(0, str(REPO))


SECTION = "## The decode step with `mx.compile` (`bench/compile_step.py`)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file's section")
    args = parser.parse_args()

    from vllmmlxd.runtime.blas import activate
    from vllmmlxd.runtime.cpus import available_cpus, default_threads

    active = activate("auto", default_threads(len(available_cpus())))  # as `vllmmlxd serve` would, before mlx loads
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    from vllmmlxd.engine.loading.loader import load_model
    from vllmmlxd.paths import resolve_state_dir

    model = load_model(args.model, resolve_state_dir()).model
    layers = model.layers if hasattr(model, "layers") else model.model.layers
    block_class = layers[0].__class__
    eager_call = block_class.__call__

    def mlp_half(layer):
        def half(h):
            return h + layer.mlp(layer.post_attention_layernorm(h))

        return mx.compile(half)

    def compiled_block_call(self, x, mask=None, cache=None):
        r = self.self_attn(self.input_layernorm(x), mask, cache)
        return self._half(x + r)

    def use(variant: str) -> None:
        if variant == "compiled MLP":
            for layer in layers:
                layer._half = mlp_half(layer)
            block_class.__call__ = compiled_block_call
        else:
            block_class.__call__ = eager_call

    def run(batch: int, variant: str) -> tuple[float, list[list[int]]]:
        use(variant)
        gen = BatchGenerator(model, completion_batch_size=batch, prefill_batch_size=batch)
        if variant == "compiled sampling":
            gen._generation_batch.fallback_sampler = gen.sampler = mx.compile(lambda lp: mx.argmax(lp, axis=-1))
        prompts = [[1 + b, 2 + b, 3 + b, 4 + b] for b in range(batch)]
        uids = gen.insert(prompts, max_tokens=[args.steps + 10] * batch)
        out: dict[int, list[int]] = {u: [] for u in uids}
        times = []
        while len(out[uids[0]]) < args.steps:
            started = time.perf_counter()
            _, responses = gen.next()
            times.append(time.perf_counter() - started)
            for r in responses:
                out[r.uid].append(r.token)
        gen.close()
        return statistics.median(times[5:]), [out[u] for u in uids]

    variants = ["eager", "compiled MLP", "compiled sampling"]
    lines = [
        SECTION,
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/compile_step.py {' '.join(sys.argv[1:])}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, MLX {mx.__version__} on "
        f"{mx.default_device()}; BLAS {active.info.name}, {active.info.threads} thread(s), as `vllmmlxd serve` runs",
        f"- Model: `{args.model}`; median decode step (`BatchGenerator.next()`, greedy) over {args.steps} steps, "
        f"median of {args.rounds} interleaved rounds; greedy tokens checked equal to eager's",
        "",
        "| batch | eager | compiled MLP | compiled sampling |",
        "|---|---|---|---|",
    ]
    for batch in (int(b) for b in args.batch.split(",")):
        times: dict[str, list[float]] = {v: [] for v in variants}
        reference = None
        for _ in range(args.rounds):
            for variant in variants:
                t, tokens = run(batch, variant)
                times[variant].append(t)
                if reference is None:
                    reference = tokens
                elif tokens != reference:
                    print(f"  {variant}: greedy tokens differ from eager at batch {batch}")
        base = statistics.median(times["eager"])
        cells = [str(batch)]
        for variant in variants:
            t = statistics.median(times[variant])
            cells.append(f"{t * 1000:.1f} ms" + ("" if variant == "eager" else f" ({t / base:.2f}x)"))
        lines.append("| " + " | ".join(cells) + " |")
    use("eager")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_section(args.write, SECTION, text)


if __name__ == "__main__":
    main()
