"""Llama split by pipeline: mlx-lm's llama with mlx-lm's own ``PipelineMixin``.

mlx-lm 0.32 pipelines qwen2, deepseek and others, but its llama (and so mistral, SmolLM2 and
every llama-shaped model) has no ``PipelineMixin``. This adds it the way mlx-lm's pipelined
models do it: each rank runs its own layers, receiving the hidden state from the rank after
it and sending to the rank before it (rank 0 runs the last layers), then an ``all_gather``
hands every rank the final state, so each one computes the same logits. Only rank processes
of a distributed entry build it (``engine/distributed/shard_load.py``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.pipeline import PipelineMixin


class PipelinedLlamaModel(PipelineMixin, llama.LlamaModel):
    def __init__(self, args: llama.ModelArgs):
        llama.LlamaModel.__init__(self, args)
        # PipelineMixin's own __init__ takes no args: its fields, as it sets them.
        self.pipeline_rank = 0
        self.pipeline_size = 1
        self.start_idx = 0
        self.end_idx = None

    def __call__(self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None) -> mx.array:
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        layers = self.pipeline_layers
        if cache is None:
            cache = [None] * len(layers)
        # The masks of this rank's own layers (the cache list holds only theirs).
        full = next((i for i, layer in enumerate(layers) if not layer.use_sliding), None)
        sliding = next((i for i, layer in enumerate(layers) if layer.use_sliding), None)
        fa_mask = create_attention_mask(h, cache[full]) if full is not None else None
        swa_mask = (
            create_attention_mask(h, cache[sliding], window_size=self.sliding_window) if sliding is not None else None
        )
        rank, size = self.pipeline_rank, self.pipeline_size
        if rank < size - 1:
            h = mx.distributed.recv_like(h, rank + 1)
        for layer, c in zip(layers, cache):
            h = layer(h, swa_mask if layer.use_sliding else fa_mask, cache=c)
        if rank != 0:
            h = mx.distributed.send(h, (rank - 1) % size)
            if cache[-1] is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        if size > 1:
            # Every rank gets rank 0's final state, kept in the graph.
            h = mx.distributed.all_gather(h)[: h.shape[0]]
        return self.norm(h)


class Model(llama.Model):
    def __init__(self, args: llama.ModelArgs):
        super().__init__(args)
        self.model = PipelinedLlamaModel(args)

    @property
    def layers(self) -> list[Any]:
        return self.model.pipeline_layers
