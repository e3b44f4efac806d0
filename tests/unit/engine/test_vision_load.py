"""A vision-language model (builtin:tiny-vlm) loads through mlx-vlm, and the decoder the engine
runs is mlx-vlm's own over the same arrays: the same logits, no weight copied."""

from __future__ import annotations

import mlx.core as mx
import pytest

from vllmmlxd.engine.loading.loader import load_model


@pytest.fixture(scope="module")
def loaded(state_dir):
    return load_model("builtin:tiny-vlm", state_dir)


def test_the_engines_decoder_is_mlx_vlms_over_the_same_arrays(loaded):
    assert loaded.vision is not None and loaded.context_length == 2048
    tokens = mx.array([[1, 504, 3026, 28, 49155, 49155, 2]])  # text and image placeholder ids alike
    ours = loaded.model(tokens)
    theirs = loaded.vision.model.language_model(tokens).logits
    assert mx.array_equal(ours, theirs)
    # Shared, not copied: the decoder's embedding is the VLM's own array.
    assert loaded.model.model.embed_tokens.weight is loaded.vision.model.language_model.embed_tokens.weight


def test_the_tokenizer_knows_the_image_tokens_and_the_ends_of_a_turn(loaded):
    vocab = loaded.tokenizer.get_vocab()
    assert vocab["<image>"] == 49155 and vocab["<end_of_utterance>"] == 49157
    assert {2, 49157} <= set(loaded.tokenizer.eos_token_ids)
    assert type(loaded.vision.processor.image_processor).__name__ == "SmolVLMImageProcessorPil"  # no torch
