"""Random-weight models made from builtin:tiny for tests that need what it lacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import mlx.core as mx
from tokenizers import Tokenizer

from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.paths import default_state_dir

ALWAYS, AFTER = 0, 1  # hidden dimensions no layer writes: what the embedding puts there reaches the last norm
HELD_VALUE = 100.0
LOGIT = 1e4  # far above any logit the random weights give, at any temperature
ANSWER = "Hello"  # one token in SmolLM2's vocabulary


def copy_of_tiny(dest: Path) -> tuple[Path, Path]:
    """builtin:tiny's folder, and a fresh copy of it beside ``dest`` to change and then rename to it."""
    src = ensure_builtin("tiny", default_state_dir())
    tmp = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    return src, tmp


def answering_tiny(dest: Path, context: int = 32768) -> Path:
    """builtin:tiny with a ``context``-token window whose every answer is ``ANSWER`` and then
    the end of the turn.

    Agents such as Codex send a ~9k-token system prompt and no ``max_output_tokens``, and treat a
    response cut by the token limit as an error; random weights never end a turn. So, by
    construction: two hidden dimensions are left alone by every layer. Every token's embedding
    holds ``HELD_VALUE`` in ALWAYS; ``ANSWER``'s also in AFTER. The untied output layer reads
    ALWAYS (times LOGIT) for ``ANSWER`` and AFTER (times 2 LOGIT) for the end-of-turn token, and
    nothing of either dimension for any other token. After any token but ``ANSWER``, ``ANSWER``
    wins; after ``ANSWER``, the end does: at every position, sampled or greedy.
    """
    if (dest / "config.json").exists():
        return dest
    src, tmp = copy_of_tiny(dest)
    config = json.loads((src / "config.json").read_text())
    weights = cast(dict[str, mx.array], mx.load(str(src / "model.safetensors")))  # a .safetensors: tensors by name
    [answer] = Tokenizer.from_file(str(src / "tokenizer.json")).encode(ANSWER, add_special_tokens=False).ids
    embed = weights["model.embed_tokens.weight"]
    width = embed.shape[1]
    always, after = (mx.zeros((width,)).at[d].add(1.0) for d in (ALWAYS, AFTER))
    free = 1 - always - after
    head = embed * free
    head[answer] = always * LOGIT
    head[config["eos_token_id"]] = after * 2 * LOGIT
    embed = embed * free + always * HELD_VALUE
    embed[answer] = embed[answer] + after * HELD_VALUE
    weights["lm_head.weight"], weights["model.embed_tokens.weight"] = head, embed
    for name in list(weights):
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = weights[name] * free[:, None]  # nothing written to the held dimensions
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    config.update(tie_word_embeddings=False, max_position_embeddings=context)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_config = json.loads((tmp / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = context
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (tmp / ".vllmmlxd-complete").unlink(missing_ok=True)
    tmp.rename(dest)
    return dest


FIM_TOKENS = {"<gh_stars>": "<|fim_prefix|>", "<issue_start>": "<|fim_suffix|>", "<issue_comment>": "<|fim_middle|>"}


def fim_tiny(dest: Path) -> Path:
    """builtin:tiny whose tokenizer carries Qwen2.5-Coder's fill-in-the-middle control tokens: three
    of SmolLM2's unused special tokens renamed (same ids, so the weights fit as they are)."""
    if (dest / "config.json").exists():
        return dest
    _, tmp = copy_of_tiny(dest)
    tokenizer = json.loads((tmp / "tokenizer.json").read_text())
    for added in tokenizer["added_tokens"]:
        added["content"] = FIM_TOKENS.get(added["content"], added["content"])
    vocab = tokenizer["model"]["vocab"]
    for old, new in FIM_TOKENS.items():
        vocab[new] = vocab.pop(old)
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((tmp / "tokenizer_config.json").read_text())
    for entry in (config.get("added_tokens_decoder") or {}).values():
        entry["content"] = FIM_TOKENS.get(entry["content"], entry["content"])
    config["additional_special_tokens"] = [FIM_TOKENS.get(t, t) for t in config.get("additional_special_tokens", [])]
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (tmp / ".vllmmlxd-complete").unlink(missing_ok=True)
    tmp.rename(dest)
    return dest
