"""Run in a fresh interpreter: choose a BLAS, load each model, print its greedy tokens and the
log-probabilities of its first generated token, one JSON line per model.

    python -m tests.support.greedy BLAS TOKENS MODEL [MODEL...]

Used to compare the engine's outputs across BLAS libraries; each library needs its own process.
"""

from __future__ import annotations

import json
import sys

PROMPT = [{"role": "user", "content": "Name three colours and say why the sky is blue."}]


def main(blas: str, tokens: int, models: list[str]) -> None:
    from vllmmlxd.runtime.blas import activate

    active = activate(blas, 1)

    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from vllmmlxd.engine.loading.blas_check import confirm
    from vllmmlxd.engine.loading.loader import load_model
    from vllmmlxd.paths import resolve_state_dir

    info = confirm(active)
    for model in models:
        loaded = load_model(model, resolve_state_dir())
        prompt = loaded.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
        out, first = [], None
        # One prefill: the first step's log-probabilities stand for the prompt's last-token logits.
        for token, logprobs in generate_step(mx.array(prompt), loaded.model, max_tokens=tokens):
            out.append(int(token))
            first = logprobs.tolist() if first is None else first
        text = loaded.tokenizer.decode(out)
        print(json.dumps({"model": model, "blas": info.name, "tokens": out, "text": text, "logits": first}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
