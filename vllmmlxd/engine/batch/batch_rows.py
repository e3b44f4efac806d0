"""One row of mlx-lm's running batches, read from outside: what its windowed and recurrent layers
hold now, for the prefix cache's captures (``layered_kv.LayeredKV.capture``).

mlx-lm's ``BatchGenerator`` keeps a row in its prompt batch while it is prefilled, then in its
generation batch; both keep, per row, the tokens their KV holds (``tokens``) and one batched
cache a layer, each able to ``extract`` a row (mlx-lm names the two batches privately: read
through ``mlxlm``).
"""

from __future__ import annotations

from typing import Any

from mlx_lm.generate import BatchGenerator

from .mlxlm import generation_batch, prompt_batch


def row_layers(gen: BatchGenerator, uid: int, layers: tuple[int, ...]) -> tuple[int, list[Any]] | None:
    """Row ``uid``'s position (the tokens its KV holds) and its caches of ``layers``, extracted
    (one row each); None when the row is in neither batch."""
    for batch in (prompt_batch(gen), generation_batch(gen)):
        if uid not in batch.uids:
            continue
        idx = batch.uids.index(uid)
        flush = getattr(batch, "flush", None)
        if flush is not None:  # a prompt chunk riding on the next pass runs first (row_groups)
            flush()
        return len(batch.tokens[idx]), [batch.prompt_cache[i].extract(idx) for i in layers]
    return None
