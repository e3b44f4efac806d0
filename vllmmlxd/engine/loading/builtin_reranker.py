"""builtin:tiny-reranker: a random-weight BERT cross-encoder (``BertForSequenceClassification``,
one label) with all-MiniLM-L6-v2's tokenizer, for tests of reranking.

Weights come from ``numpy.random.default_rng(0)`` in a fixed order, so they are the same on
every platform. The pooler and classifier are drawn wider than the encoder so that scores
spread over (0, 1) rather than all sitting at one value: tests compare two paths' scores,
and equal scores would hide a wrong order or a wrong pair.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np

TINY_RERANKER_CONFIG: dict = {
    "architectures": ["BertForSequenceClassification"],
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
    "pad_token_id": 0,
    "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0},
}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "special_tokens_map.json")


def make_tiny_reranker_weights(config: dict = TINY_RERANKER_CONFIG) -> dict[str, np.ndarray]:
    """The float32 weights by their names in a transformers checkpoint of BertForSequenceClassification."""
    rng = np.random.default_rng(0)
    hidden, inter = config["hidden_size"], config["intermediate_size"]

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": np.ones(hidden, np.float32), f"{prefix}.bias": np.zeros(hidden, np.float32)}

    def linear(prefix: str, dims_out: int, dims_in: int, std: float = 0.02) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": normal(dims_out, dims_in, std=std), f"{prefix}.bias": normal(dims_out, std=std)}

    w: dict[str, np.ndarray] = {
        "bert.embeddings.word_embeddings.weight": normal(config["vocab_size"], hidden, std=1.0),
        "bert.embeddings.position_embeddings.weight": normal(config["max_position_embeddings"], hidden, std=0.5),
        "bert.embeddings.token_type_embeddings.weight": normal(config["type_vocab_size"], hidden, std=0.5),
        **norm("bert.embeddings.LayerNorm"),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}"
        for name in ("query", "key", "value"):
            w.update(linear(f"{p}.attention.self.{name}", hidden, hidden, std=0.2))
        w.update(linear(f"{p}.attention.output.dense", hidden, hidden, std=0.2))
        w.update(norm(f"{p}.attention.output.LayerNorm"))
        w.update(linear(f"{p}.intermediate.dense", inter, hidden, std=0.2))
        w.update(linear(f"{p}.output.dense", hidden, inter, std=0.2))
        w.update(norm(f"{p}.output.LayerNorm"))
    w.update(linear("bert.pooler.dense", hidden, hidden, std=0.3))
    w.update(linear("classifier", 1, hidden, std=0.5))
    return w


def build_tiny_reranker(folder: Path, minilm: Path) -> None:
    """Fill ``folder``: config, weights, and the tokenizer of the MiniLM folder ``minilm``."""
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, folder / name)
    tokenizer_config = json.loads((minilm / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config["model_max_length"] = TINY_RERANKER_CONFIG["max_position_embeddings"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(TINY_RERANKER_CONFIG, indent=2), encoding="utf-8")
    weights = {k: mx.array(v) for k, v in make_tiny_reranker_weights().items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
