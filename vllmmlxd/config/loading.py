"""What a model entry served here loads, and when: its spec, eager or lazy, a download."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from .base import Strict
from .fields import ModelSpec
from .names import hub_repo_id

LoadMode = Literal["eager", "lazy"]
Task = Literal["auto", "rerank"]
DEFAULT_LOAD: LoadMode = "eager"  # what status shows of an entry that says nothing


class LoadingConfig(Strict):
    """``model``, ``load``, ``idle_unload_s``, ``download``, ``trust_remote_code``, ``task``."""

    model: ModelSpec = Field(description="builtin:NAME, a .gguf path, a local MLX folder or a Hugging Face repo id")
    load: LoadMode = Field(DEFAULT_LOAD, description="eager: at start; lazy: on the first request through the gateway")
    idle_unload_s: float | None = Field(None, gt=0, description="lazy models: stop after this long without a request")
    download: bool = Field(
        False,
        description="a Hugging Face repo id not in the model store yet: the daemon downloads it (status shows "
        "its progress) instead of refusing it with the `vllmmlxctl pull` to run",
    )
    trust_remote_code: bool = Field(False, description="let the model's own Python code run when it loads")
    task: Task = Field(
        "auto",
        description="rerank: serve a causal LM of the Qwen3-Reranker kind as a reranker (/v1/rerank, /v1/score); "
        "auto: BERT cross-encoder folders rerank, embedding models embed, the rest generate",
    )

    @model_validator(mode="after")
    def _download_needs_a_repo(self) -> Self:
        # Said at load: `download: true` on a builtin or a path would silently mean nothing.
        if self.download and hub_repo_id(self.model) is None:
            raise ValueError("download: true needs a Hugging Face repo id (org/name) as model")
        return self

    @model_validator(mode="after")
    def _lifecycle(self) -> Self:
        if self.idle_unload_s is not None and self.load != "lazy":
            raise ValueError("idle_unload_s needs load: lazy (an eager model stays loaded)")
        return self
