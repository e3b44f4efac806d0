"""Load one rank's share of a model split over a distributed group.

The steps of mlx-lm's ``sharded_load``, with its own pieces (``load_model`` lazily,
``model.model.pipeline(group)``, ``model.shard(group)``, then one evaluation of what the rank
kept), and two differences, each for a reason: llama models are built with vllmmlxd's
pipelined llama (mlx-lm's has no ``PipelineMixin``; ``sharded_load`` cannot be handed a model
class), and a local folder needs no ``model.safetensors.index.json`` (weights load lazily, so a
rank reads only the tensors of its own layers from a single file too; the index is used, as
mlx-lm does, to download only a rank's files of a hub model).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlx_lm.utils import _download, _get_classes, load_model

from vllmmlxd.engine.distributed import pipeline_llama, shard_llama
from vllmmlxd.engine.loading.loader import LoadedModel, context_length_of, prefer_cpu_dtype, resolve_spec
from vllmmlxd.errors import ModelLoadError
from vllmmlxd.log import log_event
from vllmmlxd.runtime.shard_families import MLX_LM_REMAPPING, layer_share

# What a rank fetches of a hub model before it knows its share (as mlx-lm's sharded_load).
CONFIG_FILES = ["*.json", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt", "*.jsonl", "*.jinja"]
logger = logging.getLogger(__name__)
LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _family(config: dict) -> str:
    model_type = str(config.get("model_type", ""))
    return MLX_LM_REMAPPING.get(model_type, model_type)


def model_classes(parallel: str) -> Callable[[dict], tuple[Any, Any]]:
    """mlx-lm's class lookup, with vllmmlxd's pipelined llama where a pipeline needs it."""

    def classes(config: dict) -> tuple[Any, Any]:
        model_class, args_class = _get_classes(config)
        if parallel == "pipeline" and _family(config) == "llama":
            return pipeline_llama.Model, args_class
        return model_class, args_class

    return classes


def shard_files(index: dict[str, str], layers: int, start: int, end: int) -> set[str]:
    """The weight files a pipeline rank running layers [start, end) needs: those holding its layers,
    and those with anything outside the layers (embeddings, final norm, head: every rank keeps them)."""
    files = set()
    for name, file in index.items():
        m = LAYER_RE.search(name)
        if m is None or start <= int(m.group(1)) < end:
            files.add(file)
    return files


def _local_path(source: Path | str, parallel: str, group: mx.distributed.Group) -> Path:
    if isinstance(source, Path):
        return source
    path = _download(source, allow_patterns=CONFIG_FILES)
    if parallel != "pipeline":
        return _download(source)
    index_file = path / "model.safetensors.index.json"
    if not index_file.is_file():
        raise ModelLoadError(
            f"{source} has no model.safetensors.index.json: a pipeline rank cannot tell which files hold its layers"
        )
    config = json.loads((path / "config.json").read_text())
    layers = int((config.get("text_config") or config)["num_hidden_layers"])
    start, end = layer_share(layers, group.size(), group.rank())
    return _download(
        source, allow_patterns=sorted(shard_files(json.loads(index_file.read_text())["weight_map"], layers, start, end))
    )


def load_shard(
    spec: str, state_dir: Path, group: mx.distributed.Group, parallel: str, *, trust_remote_code: bool = False
) -> LoadedModel:
    """This rank's share of the model ``spec`` names, split ``parallel`` ("pipeline" or "tensor") over ``group``."""
    started = time.monotonic()
    source, name = resolve_spec(spec, state_dir)
    try:
        path = _local_path(source, parallel, group)
        model, config = load_model(
            path,
            lazy=True,
            strict=False,
            get_model_classes=model_classes(parallel),
            trust_remote_code=trust_remote_code,
        )
        if parallel == "pipeline":
            if not hasattr(getattr(model, "model", None), "pipeline"):
                raise ModelLoadError(f"mlx-lm cannot split a {config.get('model_type')} model by pipeline")
            model.model.pipeline(group)
        else:
            if not hasattr(model, "shard"):
                raise ModelLoadError(f"mlx-lm cannot split a {config.get('model_type')} model by tensor")
            if _family(config) == "llama" and not shard_llama.heads_divide(model, group.size()):
                shard_llama.shard_by_kv_groups(model, group)
            else:
                model.shard(group)
        mx.eval(model.parameters())
        tokenizer = load_tokenizer(
            path, {"trust_remote_code": trust_remote_code}, eos_token_ids=config.get("eos_token_id", None)
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-lm raises ValueError, FileNotFoundError, hub and network errors
        raise ModelLoadError(f"cannot load a {parallel} share of {spec!r}: {type(exc).__name__}: {exc}") from exc
    prefer_cpu_dtype(model, config)
    log_event(
        logger,
        "model.load",
        spec=spec,
        path=str(path),
        parallel=parallel,
        rank=group.rank(),
        world=group.size(),
        seconds=round(time.monotonic() - started, 2),
    )
    # Every rank has its share before any serves (as sharded_load ends).
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
    return LoadedModel(model, tokenizer, path, context_length_of(config), name)
