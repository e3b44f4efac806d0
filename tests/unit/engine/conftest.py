"""Engine fixtures: a toy llama GGUF written with mx.save_gguf, laid out as llama.cpp writes it."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import pre_tokenizers

TOY = {"hidden": 32, "heads": 4, "kv_heads": 2, "inter": 64, "layers": 2}
TOY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOY_MERGES = ["Ġ t", "h e", "Ġt he"]


def toy_tokens() -> list[str]:
    return TOY_SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, written out independently of the product."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def toy_hf_weights(seed: int = 1) -> dict[str, np.ndarray]:
    """Random HF-layout llama weights with an untied lm_head."""
    rng = np.random.default_rng(seed)
    h, i, head_dim = TOY["hidden"], TOY["inter"], TOY["hidden"] // TOY["heads"]
    vocab = len(toy_tokens())
    n = lambda *s: np.asarray(rng.normal(0, 0.2, s), dtype=np.float32)  # noqa: E731
    w = {"model.embed_tokens.weight": n(vocab, h), "model.norm.weight": 1 + n(h), "lm_head.weight": n(vocab, h)}
    for layer in range(TOY["layers"]):
        p = f"model.layers.{layer}"
        w |= {
            f"{p}.self_attn.q_proj.weight": n(h, h),
            f"{p}.self_attn.k_proj.weight": n(TOY["kv_heads"] * head_dim, h),
            f"{p}.self_attn.v_proj.weight": n(TOY["kv_heads"] * head_dim, h),
            f"{p}.self_attn.o_proj.weight": n(h, h),
            f"{p}.mlp.gate_proj.weight": n(i, h),
            f"{p}.mlp.up_proj.weight": n(i, h),
            f"{p}.mlp.down_proj.weight": n(h, i),
            f"{p}.input_layernorm.weight": 1 + n(h),
            f"{p}.post_attention_layernorm.weight": 1 + n(h),
        }
    return w


def to_gguf_tensors(hf: dict[str, np.ndarray], permute: bool = True) -> dict[str, mx.array]:
    """Rename to GGUF names and (for llama) permute q/k the way llama.cpp does."""
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    out = {}
    for name, value in hf.items():
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            if permute and module == "self_attn.q_proj":
                value = llama_cpp_permute(value, TOY["heads"])
            elif permute and module == "self_attn.k_proj":
                value = llama_cpp_permute(value, TOY["kv_heads"])
            out[f"blk.{layer}.{names[module]}.{kind}"] = value
        else:
            out[
                {
                    "model.embed_tokens.weight": "token_embd.weight",
                    "model.norm.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight",
                }[name]
            ] = value
    return {k: mx.array(v) for k, v in out.items()}


def toy_metadata(**overrides) -> dict:
    tokens = toy_tokens()
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    meta = {
        "general.architecture": "llama",
        "general.name": "toy",
        "llama.embedding_length": u32(TOY["hidden"]),
        "llama.feed_forward_length": u32(TOY["inter"]),
        "llama.block_count": u32(TOY["layers"]),
        "llama.attention.head_count": u32(TOY["heads"]),
        "llama.attention.head_count_kv": u32(TOY["kv_heads"]),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "llama.context_length": u32(512),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": TOY_MERGES,
        "tokenizer.ggml.token_type": mx.array(
            [3] * len(TOY_SPECIALS) + [1] * (len(tokens) - len(TOY_SPECIALS)), dtype=mx.int32
        ),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.ggml.padding_token_id": u32(2),
        "tokenizer.ggml.unknown_token_id": u32(0),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    }
    meta.update(overrides)
    return meta


def write_toy_gguf(path: Path, **meta_overrides) -> Path:
    mx.save_gguf(str(path), to_gguf_tensors(toy_hf_weights()), toy_metadata(**meta_overrides))
    return path


@pytest.fixture
def toy_gguf(tmp_path: Path) -> Path:
    """A small llama GGUF (float32 tensors, byte-level BPE tokenizer) in a temp dir."""
    return write_toy_gguf(tmp_path / "toy-model.gguf")
