"""GGUF → MLX folder conversion, and the build-once cache the converted folders live in.

``mx.load`` reads the GGUF; quantized tensors (Q4_0/Q4_1/Q8_0) come back as
(weight, scales, biases) triples that we dequantize to float16. The result is a
standard Hugging Face-layout folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) that ``mlx_lm.utils.load`` reads like any other.

A GGUF file named in the config is converted in a child process (:mod:`gguf_convert`):
MLX's GGUF reader is not hardened against malformed files, and the worker must survive one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from vllmmlxd.engine.loading import gguf_convert
from vllmmlxd.errors import ModelLoadError
from vllmmlxd.log import log_event

logger = logging.getLogger(__name__)

MARKER = ".vllmmlxd-complete"
DIGESTS = ".gguf-digests"  # under the models dir: a file's sha256 by (path, size, mtime)
TMP_PREFIX = ".tmp-"  # a build in progress: .tmp-<target>-<pid>-<random>
STALE_PREFIX = ".stale-"
LEGACY_TMP_AGE_S = 3600  # a temp folder with no pid in its name is someone's only after this long
GROUP_SIZE = 32  # every GGUF block type mx.load understands packs 32 weights per block
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
# llama.cpp permutes q/k rows for its interleaved rope in these architectures only.
_PERMUTED = {"llama", "mistral"}
_CONTROL, _USER_DEFINED = 3, 4

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# The Split regexes of the Hugging Face tokenizers llama.cpp names by ``tokenizer.ggml.pre``.
_SPLIT_PATTERNS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def load_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Read a GGUF file's tensors and metadata (``mx.load``), as ModelLoadError on failure."""
    try:
        # With return_metadata, a (tensors, metadata) pair; mlx types every form load can return as one union.
        return cast(tuple[dict[str, mx.array], dict[str, Any]], mx.load(str(path), return_metadata=True))
    except Exception as exc:  # mlx raises plain RuntimeError/ValueError for bad files
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc


def meta_value(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    """One metadata value as a Python scalar (mx.load returns numbers as 0-d arrays)."""
    value = meta.get(key, default)
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def dequantize_tensors(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """Fold each (weight, scales, biases) triple into one float16 ``weight``; pass others through."""
    out: dict[str, mx.array] = {}
    for name, value in tensors.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base is not None and f"{base}.scales" in tensors:
            scales = tensors[f"{base}.scales"]
            # bits = packed uint32 columns per group of 32 weights (4 for Q4_*, 8 for Q8_0)
            bits = value.shape[-1] // scales.shape[-1]
            value = mx.dequantize(
                value, scales, tensors.get(f"{base}.biases"), group_size=GROUP_SIZE, bits=bits, dtype=mx.float16
            )
        out[name] = value.astype(mx.float16)
    return out


def permute_rope(w: mx.array, n_head: int) -> mx.array:
    """llama.cpp's row permutation of q/k (HF half-split rope → interleaved rope)."""
    d = w.shape[0]
    return w.reshape(n_head, 2, d // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope(w: mx.array, n_head: int) -> mx.array:
    """Inverse of :func:`permute_rope`: back to the Hugging Face layout mlx-lm's llama expects."""
    d = w.shape[0]
    return w.reshape(n_head, d // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_mlx_weights(tensors: dict[str, mx.array], meta: dict[str, Any]) -> dict[str, mx.array]:
    """Rename GGUF tensors to mlx-lm names, undoing llama.cpp's q/k permutation."""
    arch = meta_value(meta, "general.architecture")
    n_head = meta_value(meta, f"{arch}.attention.head_count")
    n_kv = meta_value(meta, f"{arch}.attention.head_count_kv", n_head)
    out: dict[str, mx.array] = {}
    for name, value in dequantize_tensors(tensors).items():
        stem, _, kind = name.rpartition(".")
        parts = stem.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
            if arch in _PERMUTED and parts[2] in ("attn_q", "attn_k"):
                value = unpermute_rope(value, n_head if parts[2] == "attn_q" else n_kv)
            out[f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}"] = value
        elif stem in _GLOBAL_NAMES:
            out[f"{_GLOBAL_NAMES[stem]}.{kind}"] = value
        else:
            # An unknown tensor (e.g. llama 3.1's rope_freqs) would be silently wrong if dropped.
            raise ModelLoadError(f"GGUF tensor {name!r} of architecture {arch!r} is not supported")
    return out


def make_config(meta: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    """The Hugging Face config.json of the converted model."""
    arch = meta_value(meta, "general.architecture")

    def m(key: str, default: Any = None) -> Any:
        return meta_value(meta, f"{arch}.{key}", default)

    hidden, n_head = m("embedding_length"), m("attention.head_count")
    config: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "hidden_size": hidden,
        "intermediate_size": m("feed_forward_length"),
        "num_hidden_layers": m("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": m("attention.head_count_kv", n_head),
        "rms_norm_eps": _f32(m("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(m("rope.freq_base", 10000.0)),
        "rope_traditional": False,
        "vocab_size": weights["model.embed_tokens.weight"].shape[0],
        "max_position_embeddings": m("context_length", 4096),
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "bos_token_id": meta_value(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta_value(meta, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float16",
    }
    head_dim = m("attention.key_length")
    if head_dim and head_dim != hidden // n_head:
        config["head_dim"] = head_dim
    scaling = m("rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(m("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise ModelLoadError(f"GGUF rope scaling {scaling!r} is not supported")
    return {k: v for k, v in config.items() if v is not None}


def make_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` from GGUF metadata (``tokenizer.ggml.model == "gpt2"``)."""
    kind = meta_value(meta, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "use the model's Hugging Face or MLX folder instead"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    pre = meta_value(meta, "tokenizer.ggml.pre", "default")
    if pre in _SPLIT_PATTERNS:
        split = pre_tokenizers.Split(_SPLIT_PATTERNS[pre], behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    else:
        if pre not in ("smollm", "default", "gpt2"):
            log_event(logger, "model.convert.pretokenizer", logging.WARNING, pre=pre, using="smollm")
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    post: list = [processors.ByteLevel(trim_offsets=False)]
    if meta_value(meta, "tokenizer.ggml.add_bos_token", False):
        bos_id = meta_value(meta, "tokenizer.ggml.bos_token_id")
        bos = tokens[bos_id]
        post.append(
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, bos_id)]
            )
        )
    tok.post_processor = post[0] if len(post) == 1 else processors.Sequence(post)
    types = meta_value(meta, "tokenizer.ggml.token_type", [])
    # Control tokens (<|im_start|>...) must never be split by BPE; user-defined ones stay un-split but plain.
    tok.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    )
    tok.add_tokens(
        [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    )
    return tok


def make_tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json: special tokens by their GGUF ids, chat template, BOS policy."""
    tokens = meta["tokenizer.ggml.tokens"]
    arch = meta_value(meta, "general.architecture")

    def token(key: str) -> str | None:
        idx = meta_value(meta, f"tokenizer.ggml.{key}_token_id")
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": bool(meta_value(meta, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta_value(meta, "tokenizer.ggml.add_eos_token", False)),
        "model_max_length": meta_value(meta, f"{arch}.context_length", 4096),
        "clean_up_tokenization_spaces": False,
        "chat_template": meta_value(meta, "tokenizer.chat_template"),
    }
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer(meta: dict[str, Any], folder: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json built from GGUF metadata into ``folder``."""
    make_tokenizer(meta).save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", make_tokenizer_config(meta))


def convert_gguf(gguf_path: Path, folder: Path) -> None:
    """Convert one GGUF file into an mlx-lm loadable folder (which must exist, empty)."""
    tensors, meta = load_gguf(gguf_path)
    arch = meta_value(meta, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    write_tokenizer(meta, folder)  # first: it rejects unsupported tokenizers before the heavy work
    weights = to_mlx_weights(tensors, meta)
    write_json(folder / "config.json", make_config(meta, weights))
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})


def convert_gguf_cached(gguf_path: Path, models_dir: Path) -> Path:
    """The converted folder of ``gguf_path`` under ``models_dir``, converting it on first use.

    The conversion runs in a child process; if it fails, ``build_once`` removes the partial folder.
    """
    digest = remembered_sha256(gguf_path, models_dir / DIGESTS)[:16]

    def build(folder: Path) -> None:
        started = time.monotonic()
        log_event(logger, "model.convert", source=str(gguf_path), target=str(folder))
        gguf_convert.convert_in_child(gguf_path, folder)
        log_event(logger, "model.convert.done", source=str(gguf_path), seconds=round(time.monotonic() - started, 2))

    return build_once(models_dir / f"gguf-{digest}", build)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it with ``build(tmpdir)`` first if it is not complete yet.

    Safe across processes: each builder fills its own temporary sibling, writes the
    marker last and renames into place; a loser of the rename race keeps the winner's.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(target)
    if (target / MARKER).exists():
        return target
    if target.exists() and not (target / MARKER).exists():
        # Left by something that bypassed this function: move it aside rather than trust it.
        stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".stale-{target.name}-"))
        with contextlib.suppress(OSError):  # another process moved it first
            os.rename(target, stale / target.name)
        shutil.rmtree(stale, ignore_errors=True)
    # The builder's pid in the name tells a later start whether this folder is still being filled.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{TMP_PREFIX}{target.name}-{os.getpid()}-"))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would make the cache folder unlike its siblings
        write_json(tmp / MARKER, {"built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MARKER).exists():
                raise
            log_event(logger, "model.cache.race", target=str(target), kept="other")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def remove_abandoned_builds(target: Path, now: float | None = None) -> list[Path]:
    """Delete the temporary folders of ``target``'s builds whose builder died (a conversion
    killed halfway leaves gigabytes behind); returns what was removed.

    A folder named with a live pid is another process's build in progress and stays.
    """
    now = time.time() if now is None else now
    removed = []
    for prefix in (TMP_PREFIX, STALE_PREFIX):
        for folder in target.parent.glob(f"{prefix}{target.name}-*"):
            if _abandoned(folder, folder.name[len(prefix) + len(target.name) + 1 :], now):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    if removed:
        log_event(logger, "model.cache.cleaned", target=str(target), removed=len(removed))
    return removed


def _abandoned(folder: Path, rest: str, now: float) -> bool:
    pid_text = rest.split("-", 1)[0]
    if pid_text.isdigit() and "-" in rest:
        return not _alive(int(pid_text))
    try:  # an older name without a pid: only when nobody has touched it for a long time
        return now - folder.stat().st_mtime > LEGACY_TMP_AGE_S
    except OSError:
        return False


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remembered_sha256(path: Path, memo_dir: Path) -> str:
    """``file_sha256(path)``, hashed once per file version: remembered under ``memo_dir`` by the
    resolved path, size and mtime_ns, so a multi-gigabyte GGUF is not read whole at every start.

    An edited or replaced file changes size or mtime and is hashed again.
    """
    resolved = path.resolve()
    info = resolved.stat()
    version = f"{resolved}\0{info.st_size}\0{info.st_mtime_ns}"
    memo = memo_dir / (hashlib.sha256(version.encode()).hexdigest()[:32] + ".json")
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if known.get("version") == version and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = file_sha256(resolved)
    memo_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=memo_dir, prefix=".tmp-", suffix=".json")  # written whole, then renamed
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"version": version, "path": str(resolved), "sha256": digest}, f)
    os.replace(tmp, memo)
    return digest


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented UTF-8 JSON (how every config file of a model folder is written)."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _f32(value: float) -> float:
    # GGUF stores float32: 1e-05 reads back as 9.9999997e-06; 7 digits recover the intended value.
    return float(f"{value:.7g}")
