"""Confirm that MLX really multiplies with the BLAS the worker loaded.

The bundled reference BLAS adds the terms of each product one by one, in order; optimised
libraries sum in blocks or vector lanes. The runtime's self-check found whether the chosen
library's sums differ from in-order ones on a fingerprint product; the same product through
MLX then says which library MLX calls. No timing, so a busy machine cannot fool it.
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx

from ...runtime.blas import ActiveBlas, BlasInfo
from ...runtime.blas_find import find_bundled
from ...runtime.blas_probe import fingerprint_operands


def mlx_sums_in_order() -> bool:
    """True when MLX's float32 product of the fingerprint operands is exactly 1, as in-order sums give."""
    a, b, (m, n, k) = fingerprint_operands()
    with mx.stream(mx.cpu):
        product = mx.array(a, dtype=mx.float32).reshape(m, k) @ mx.array(b, dtype=mx.float32).reshape(k, n)
        return product[0, 0].item() == 1.0


def confirm(active: ActiveBlas) -> BlasInfo:
    """``active.info``, or the bundled BLAS with a warning when MLX does not call the library."""
    info = active.info
    if active.lib is None or not active.sums_differ or not mlx_sums_in_order():
        return info  # confirmed, or a library whose sums look like the reference one's (nothing to tell by)
    why = f"MLX does not call {info.name}: its products still sum like the bundled reference BLAS"
    return dataclasses.replace(info, name="bundled", path=find_bundled(), threads=1, warning=why, env={})
