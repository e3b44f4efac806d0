"""Resolve a ``model:`` spec to a loaded mlx-lm model and tokenizer.

Specs, tried in order: ``builtin:NAME``; a path to a ``.gguf`` file (converted once into
the state dir); a local MLX / Hugging Face folder (has config.json); otherwise a Hugging
Face repo id: the model store's copy (``vllmmlxctl pull``), else handed to mlx-lm (which reads
the hub cache, and downloads it only outside the daemon: its workers run with HF_HUB_OFFLINE).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load as mlx_lm_load

from vllmmlxd.engine.loading import builtin, gguf
from vllmmlxd.engine.vision.vision_prompt import unsupported_family
from vllmmlxd.errors import ModelLoadError
from vllmmlxd.extras import missing_message
from vllmmlxd.log import log_event
from vllmmlxd.paths import models_dir
from vllmmlxd.store.layout import hub_snapshot, pull_hint, store_copy

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTH = 4096


@dataclass
class VisionParts:
    """A vision-language model's image side: mlx-vlm's whole model (its vision tower and
    connector; its decoder's arrays are the engine's model's) and its processor."""

    model: nn.Module
    processor: Any


@dataclass
class LoadedModel:
    """A model ready for the engine: mlx module, mlx-lm tokenizer, where it came from."""

    model: nn.Module
    tokenizer: TokenizerWrapper
    path: Path | str  # the MLX folder, or the repo id for hub models
    context_length: int
    name: str
    vision: VisionParts | None = None  # a VLM's image side; ``model`` is then its decoder


def load_model(spec: str, state_dir: Path, *, trust_remote_code: bool = False) -> LoadedModel:
    """Load the model a ``model:`` spec names, converting or fetching into ``state_dir`` once."""
    started = time.monotonic()
    source, name = resolve_spec(spec, state_dir)
    if is_vision_folder(source):
        return load_vision_model(spec, source, name, started)
    try:
        # With return_config the result is a triple; mlx-lm types it as either tuple (no overloads).
        model, tokenizer, config = cast(
            tuple[nn.Module, TokenizerWrapper, dict[str, Any]],
            mlx_lm_load(str(source), return_config=True, trust_remote_code=trust_remote_code),
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-lm raises ValueError, FileNotFoundError, hub and network errors
        raise ModelLoadError(f"cannot load model {spec!r}: {type(exc).__name__}: {exc}") from exc
    dtype = prefer_cpu_dtype(model, config)
    return _loaded(LoadedModel(model, tokenizer, source, context_length_of(config), name), spec, dtype, started)


def _loaded(loaded: LoadedModel, spec: str, dtype: str, started: float) -> LoadedModel:
    log_event(
        logger,
        "model.load",
        spec=spec,
        path=str(loaded.path),
        dtype=dtype,
        context_length=loaded.context_length,
        **({"vision": True} if loaded.vision is not None else {}),
        seconds=round(time.monotonic() - started, 2),
    )
    return loaded


def resolve_spec(spec: str, state_dir: Path) -> tuple[Path | str, str]:
    """Map a spec to (MLX folder or hub repo id, display name), converting GGUF/builtins first."""
    if spec.startswith("builtin:"):
        name = spec[len("builtin:") :]
        return builtin.ensure_builtin(name, state_dir), name
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return gguf.convert_gguf_cached(path.resolve(), models_dir(state_dir)), path.stem
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a folder but not a model: expected config.json and *.safetensors in it")
        return path.resolve(), path.resolve().name
    if path.exists():
        raise ModelLoadError(f"{path} is a file; expected a .gguf file, a model folder, builtin:NAME or a repo id")
    if looks_like_path(spec):
        raise ModelLoadError(
            f"model path not found: {path}; expected a .gguf file, a folder with config.json, "
            f"builtin:NAME ({', '.join(builtin.builtin_names())}) or a Hugging Face repo id (org/name)"
        )
    pulled = store_copy(spec, state_dir)
    if pulled is not None:  # `vllmmlxctl pull org/name` put it in the store: `model: org/name` is that copy
        return pulled, spec.rsplit("/", 1)[-1]
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE") and hub_snapshot(spec) is None:
        # The daemon's workers never download (HF_HUB_OFFLINE): say what to run rather than the hub's error.
        raise ModelLoadError(pull_hint(spec))
    return spec, spec.rsplit("/", 1)[-1]


def looks_like_path(spec: str) -> bool:
    """True for specs only a filesystem path could mean (a repo id is ``org/name``)."""
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec


def context_length_of(config: dict[str, Any]) -> int:
    """The model's context window from its config, else 4096."""
    for cfg in (config, config.get("text_config") or {}):
        value = cfg.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT_LENGTH


def prefer_cpu_dtype(model: nn.Module, config: dict[str, Any]) -> str:
    """On the CPU backend, run unquantized half-precision models in float32; return the dtype used.

    Measured with SmolLM2-135M on a 2-core x86 CPU: float16 decodes at ~2.8 tok/s,
    float32 at ~8 tok/s (MLX's CPU float16 matmul is slow). Metal keeps float16.
    """
    # Without a destination, tree_flatten returns (name, array) pairs; it is typed as that or a dict.
    dtypes = {v.dtype for _, v in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))}
    if mx.default_device() == mx.cpu and "quantization" not in config and dtypes & {mx.float16, mx.bfloat16}:
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        return "float32"
    return ",".join(sorted(str(d).rsplit(".", 1)[-1] for d in dtypes))


def is_vision_folder(source: Path | str) -> bool:
    """A local folder of a vision-language model (its config has a ``vision_config``)."""
    config = Path(source) / "config.json"
    if not isinstance(source, Path) or not config.is_file():
        return False
    try:
        return isinstance(json.loads(config.read_text()).get("vision_config"), dict)
    except (OSError, ValueError):
        return False


def require_vision(spec: str) -> None:
    """Refuse, naming the extra to install, a vision model where mlx-vlm is not installed."""
    missing = missing_message("vision", f"{spec!r} is a vision-language model; serving it")
    if missing:
        raise ModelLoadError(missing)


def load_vision_model(spec: str, source: Path | str, name: str, started: float) -> LoadedModel:
    """A VLM: mlx-vlm loads the whole model and its processor; the engine runs its decoder as an
    mlx-lm model over the same arrays (no copy), so it batches with text requests."""
    require_vision(spec)
    import mlx_vlm
    from mlx_lm.utils import _get_classes, load_tokenizer

    config = json.loads((Path(source) / "config.json").read_text())
    problem = unsupported_family(config.get("model_type"))
    if problem:
        raise ModelLoadError(f"cannot serve {spec!r}: {problem}")
    try:
        vlm, processor = mlx_vlm.load(str(source))
        dtype = prefer_cpu_dtype(vlm, config)  # before the decoder shares the arrays
        text = dict(config["text_config"])
        model_class, args_class = _get_classes(text)
        decoder = model_class(args_class.from_dict(text))
        shared = cast(list[tuple[str, mx.array]], tree_flatten(vlm.language_model.parameters()))
        decoder.load_weights([(n if n.startswith("lm_head") else "model." + n, v) for n, v in shared], strict=True)
        tokenizer = load_tokenizer(Path(source), eos_token_ids=config.get("eos_token_id"))
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-vlm and transformers raise many kinds
        raise ModelLoadError(f"cannot load vision model {spec!r}: {type(exc).__name__}: {exc}") from exc
    vision = VisionParts(vlm, processor)
    return _loaded(
        LoadedModel(decoder, tokenizer, source, context_length_of(config), name, vision), spec, dtype, started
    )
