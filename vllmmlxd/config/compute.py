"""How a worker computes: the BLAS library and its threads, and how requests are batched."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from .base import Strict
from .names import BLAS_NAMES


def _blas_choice(value: str) -> str:
    # A path need not exist here: a missing library falls back to the bundled BLAS with a warning.
    if value not in BLAS_NAMES and "/" not in value and not value.endswith((".so", ".dylib")) and ".so." not in value:
        raise ValueError(f"blas must be one of {', '.join(BLAS_NAMES)} or a path to a shared library")
    return value


Blas = Annotated[str, AfterValidator(_blas_choice)]


class ComputeConfig(Strict):
    """``blas``, ``threads``, ``continuous_batching``, ``max_num_seqs``, ``prefill_step_size``."""

    blas: Blas = Field(
        "auto", description="Linux: auto, mkl, blis, openblas, bundled or a path to a library exporting cblas_sgemm"
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="BLAS threads (and cores on Linux); default: an even share of the cores, one thread fewer",
    )
    continuous_batching: bool = Field(True, description="decode many requests together; false: one at a time")
    max_num_seqs: int = Field(16, ge=1, le=1024, description="requests decoded together at most (then they queue)")
    prefill_step_size: int = Field(512, ge=16, le=65536, description="prompt tokens prefilled in one step at most")
