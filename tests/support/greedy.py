"""Run in a fresh interpreter: choose a BLAS, load a model, print greedy tokens and last-token logits.

    python -m tests.support.greedy BLAS MODEL TOKENS

Used to compare the engine's outputs across BLAS libraries; each needs its own process.
"""

from __future__ import annotations

import json
import sys

PROMPT = [{"role": "user", "content": "Name three colours and say why the sky is blue."}]


def main(blas: str, model: str, tokens: int) -> None:
    from vllmmlxd.runtime.blas import activate

    active = activate(blas, 1)

    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from vllmmlxd.engine.blas_check import confirm
    from vllmmlxd.engine.loader import load_model
    from vllmmlxd.paths import resolve_state_dir

    info = confirm(active)
    loaded = load_model(model, resolve_state_dir())
    prompt = loaded.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    logits = loaded.model(mx.array([prompt]))[0, -1]
    out = [int(t) for t, _ in generate_step(mx.array(prompt), loaded.model, max_tokens=tokens)]
    print(
        json.dumps({"blas": info.name, "tokens": out, "text": loaded.tokenizer.decode(out), "logits": logits.tolist()})
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
