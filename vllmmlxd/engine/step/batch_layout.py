"""How a model's batch is laid out, chosen once per generator from the model's layout and the
entry's features, and how ``/v1/status`` says so.

Rows that join keep their KV apart: the pass written out for the plain decoders
(``row_groups``), else each attention module group by group in the model's own pass
(``grouped_attention``). A sharded model runs its own layers, and a vision model's prompts are
staged apart: both keep mlx-lm's one padded batch. Speculation brings its own generation batch
(``speculative``), off for a sharded entry and for layouts that cannot undo a draft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from mlx_lm.generate import BatchGenerator

from ..batch.batch import make_generator
from ..batch.grouped_attention import wrap_attention
from ..batch.layout import CacheLayout
from ..batch.mlxlm import generation_batch, install
from ..batch.plans import Lockstep
from ..batch.row_groups import GroupedBatch, GroupedModel, RidingPrompts, groupable
from ..options import EngineOptions
from ..speculation.speculative import SpeculativeBatch

SHARDED_NO_SPECULATION = "a sharded entry's other ranks play rank 0's batch token by token"


@dataclass
class BatchShape:
    gen: BatchGenerator
    spec: SpeculativeBatch | None  # the batch's drafting, when the entry speculates
    grouping: bool  # rows keep their KV in groups
    riding: bool  # prompt chunks ride on the decode pass


def new_generator(
    model: Any,
    options: EngineOptions,
    layout: CacheLayout,
    lockstep: Lockstep,
    *,
    vision: bool,
    draft: Any,
    cost: Callable[[], tuple[float, float] | None],
) -> BatchShape:
    """mlx-lm's generator for ``model``, with vllmmlxd's own batches installed where they apply."""
    own = not lockstep.distributed and not vision
    written = own and groupable(model)
    grouping = written or (own and wrap_attention(model, layout))
    gen = make_generator(cast(Any, GroupedModel(model, written=written)) if grouping else lockstep.wrap(model), options)
    spec = None
    if options.speculative is not None and not lockstep.distributed and layout.speculation() is None:
        rollback = layout.rollback
        assert rollback is not None  # layout.speculation() says why not where it is None
        spec = SpeculativeBatch.make(gen.model, gen.sampler, options.speculative, cost, draft, rollback)
        spec.grouping = grouping
        install(gen, generation=spec)  # mlx-lm's generator keeps this batch for its life
    elif grouping:
        batch = GroupedBatch.empty(gen.model, gen.sampler)
        batch.grouping = True
        install(gen, generation=batch)
    if written:  # a prompt's chunk rides on the batch's pass (row_groups.RidingPrompts)
        prompts = RidingPrompts.empty(gen.model, gen.sampler, prefill_step_size=options.prefill_step_size)
        prompts.decoding = lambda: len(generation_batch(gen)) > 0
        install(gen, prompts=prompts)
    return BatchShape(gen, spec, grouping, written)


def describe(
    layout: CacheLayout, shape: BatchShape, *, distributed: bool, layered: Any, block_cache: bool
) -> dict[str, Any]:
    """What the engine does for this model's layout, and why not where it does not (the ``layout``
    block of /v1/status): its batch's layout, its prefix cache, speculation."""
    spec_off = SHARDED_NO_SPECULATION if distributed else layout.speculation()
    kind = layered.cache_layout.prefix_cache(layered.block) if layered is not None else None
    batching = (
        "row groups, prompt chunks riding on the decode pass"
        if shape.riding
        else "row groups"
        if shape.grouping
        else "one padded batch"
    )
    return {
        **layout.describe(),
        "batching": batching,
        "prefix_cache": kind or ("blocks" if block_cache else "sequences"),
        "speculation": None if spec_off is None else {"off": spec_off},
    }
