"""What the builtin models share: builtin:tiny's decoder and adding whole tokens to a tokenizer.

Apart from engine/loading/builtin.py so that builtin_vlm.py (which builtin.py calls to build
builtin:tiny-vlm) reads them without importing builtin.py back.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_traditional": False,
    "vocab_size": 49154,  # SmolLM2's 49152 and the two thinking tokens
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def add_tokens(folder: Path, tokens: dict[str, int], *, special: bool) -> None:
    """Add ``tokens`` (text → id) to the folder's tokenizer.json as whole added tokens."""
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for content, token_id in tokens.items():
        data["added_tokens"].append(
            {
                "id": token_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
        )
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
