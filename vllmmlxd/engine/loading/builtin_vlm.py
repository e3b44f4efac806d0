"""``builtin:tiny-vlm``: a random-weight vision-language model of a real family, built offline.

SmolVLM (mlx-vlm's ``smolvlm``, the idefics3 family): a SigLIP vision tower, a pixel-shuffle
connector, and a llama decoder, the same shape as builtin:tiny's, with SmolLM2's tokenizer plus
SmolVLM's image tokens, transformers' SmolVLM image processor (configured, nothing fetched) and
a ChatML template with image parts. Its decoder is an mlx-lm llama, so it batches with text
requests (docs/plans/vision.md). Images are resized so the long edge is 128 px and cut into
64 x 64 tiles, each 16 image tokens, plus one global tile.

Building it needs mlx-vlm (the parameter names and shapes are its model class's); the weights
are N(0, 0.02) from ``default_rng(0)`` in sorted-name order, norms 1, biases 0: the same on
every platform.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import numpy as np

from vllmmlxd.engine.loading.builtin_shapes import TINY_CONFIG, add_tokens

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
TILE_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]  # up to 6 x 6 tiles
FIRST_NEW_ID = 49154  # after SmolLM2's 49152 and builtin:tiny's two thinking tokens
NEW_TOKENS = {t: FIRST_NEW_ID + i for i, t in enumerate(IMAGE_TOKENS + TILE_TOKENS)}
VOCAB = FIRST_NEW_ID + len(NEW_TOKENS)
TILE, PATCH, SHUFFLE = 64, 8, 2

CONFIG: dict[str, Any] = {
    "model_type": "smolvlm",
    "architectures": ["SmolVLMForConditionalGeneration"],
    "image_token_id": NEW_TOKENS["<image>"],
    "scale_factor": SHUFFLE,
    "vocab_size": VOCAB,
    "eos_token_id": [2, NEW_TOKENS["<end_of_utterance>"]],
    "torch_dtype": "float32",
    # builtin:tiny's decoder, with the image tokens and the output layer mlx-vlm's idefics3 always has.
    "text_config": {
        **{k: v for k, v in TINY_CONFIG.items() if k not in ("bos_token_id", "eos_token_id", "torch_dtype")},
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "smolvlm_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "patch_size": PATCH,
        "image_size": TILE,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
    },
}

PREPROCESSOR = {
    "image_processor_type": "SmolVLMImageProcessor",
    "processor_class": "SmolVLMProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"longest_edge": 2 * TILE},
    "max_image_size": {"longest_edge": TILE},
    "do_image_splitting": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_pad": True,
    "resample": 1,
}

# ChatML whose content may be parts; an image part is one <image>, which the processor expands.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_vlm(folder: Path, tiny: Path) -> None:
    """Fill ``folder`` with the model, its tokenizer taken from builtin:tiny's folder ``tiny``."""
    build_vlm(folder, tiny, CONFIG, PREPROCESSOR)


def build_vlm(folder: Path, tiny: Path, config: dict[str, Any], preprocessor: dict[str, Any]) -> None:
    """A random-weight SmolVLM of any size (``config``'s; the benchmarks build a larger one)."""
    vision = config["vision_config"]
    seq_len = (vision["image_size"] // vision["patch_size"]) ** 2 // config["scale_factor"] ** 2
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "SmolVLMProcessor", "image_seq_len": seq_len}, indent=2)
    )
    _write_tokenizer(folder, tiny)
    mx.save_safetensors(str(folder / "model.safetensors"), make_weights(config), metadata={"format": "mlx"})


def _write_tokenizer(folder: Path, tiny: Path) -> None:
    (folder / "tokenizer.json").write_text((tiny / "tokenizer.json").read_text(encoding="utf-8"), encoding="utf-8")
    add_tokens(folder, NEW_TOKENS, special=True)
    config = json.loads((tiny / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    config["extra_special_tokens"] = {  # what SmolVLM's processor reads off the tokenizer
        "image_token": "<image>",
        "fake_image_token": "<fake_token_around_image>",
        "global_image_token": "<global-img>",
        "end_of_utterance_token": "<end_of_utterance>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def make_weights(sizes: dict[str, Any] = CONFIG) -> dict[str, mx.array]:
    """Every parameter of mlx-vlm's SmolVLM at ``sizes``, random as the docstring says."""
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args

    family, _ = get_model_and_args(sizes)
    config = family.ModelConfig.from_dict(sizes)
    config.text_config = family.TextConfig.from_dict(sizes["text_config"])
    config.vision_config = family.VisionConfig.from_dict(sizes["vision_config"])
    # Without a destination, tree_flatten returns (name, array) pairs; it is typed as that or a dict.
    params = cast(list[tuple[str, mx.array]], tree_flatten(family.Model(config).parameters()))
    shapes = {name: value.shape for name, value in params}
    rng = np.random.default_rng(0)
    weights = {}
    for name in sorted(shapes):
        if name.endswith(".bias"):
            value = np.zeros(shapes[name], np.float32)
        elif name.endswith(".weight") and ("norm" in name.rsplit(".", 2)[-2]):
            value = np.ones(shapes[name], np.float32)
        else:
            value = rng.normal(0.0, 0.02, size=shapes[name]).astype(np.float32)
        weights[name] = mx.array(value)
    return weights
