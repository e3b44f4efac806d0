"""Names the config accepts for choices made elsewhere (parsers, builtin models, BLAS libraries).

The BLAS libraries are read from the runtime that loads them (a layer the config may import);
the parsers and the builtins live above the config (it never imports the engine or the parsers),
so their names are listed here and tests keep each list equal to the code that implements it.
"""

import re

from ..runtime.blas_find import AUTO_ORDER

# What an entry, a key or a group may be called: it appears in URLs, logs and status tables.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# `auto` tries the libraries in AUTO_ORDER; `bundled` is the one the mlx wheel links.
BLAS_NAMES = ("auto", *AUTO_ORDER, "bundled")
REASONING_PARSERS = ("qwen3", "deepseek_r1")  # as vllmmlxd/parsers/reasoning has them (a test keeps them equal)
TOOL_PARSERS = (  # as vllmmlxd/parsers/tools has them (a test keeps them equal)
    "auto",
    "deepseek",
    "functionary",
    "glm47",
    "granite",
    "harmony",
    "hermes",
    "kimi",
    "llama",
    "mistral",
    "nemotron",
    "qwen",
    "xlam",
)
# Each builtin and what it serves, as vllmmlxd/engine/loading/builtin.py has them (a test keeps them
# equal; config never imports the engine).
BUILTIN_KINDS = {
    "all-minilm-l6-v2": "embedding",
    "smollm2-135m-instruct": "generate",
    "tiny": "generate",
    "tiny-reranker": "rerank",
    "tiny-vlm": "generate",
    "tiny-whisper": "speech",
}
BUILTIN_MODELS = tuple(BUILTIN_KINDS)
BUILTIN_PREFIX = "builtin:"

# A Hugging Face model repo id as a ``model:`` spec: ``org/name``, each part letters, digits, '-', '_'
# and '.', not starting with '-' or '.', with no '--' or '..' (the hub refuses those; the store's
# folder names use '--' as the separator). Anything else that is not a builtin is a path.
REPO_ID_RE = re.compile(r"^(?!.*(?:--|\.\.))[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def hub_repo_id(spec: str) -> str | None:
    """``spec`` when a ``model:`` spec names a Hugging Face repo (``org/name``), else None: a builtin,
    a ``.gguf`` file or a path (the loader's order; a folder that exists is still a folder there)."""
    if spec.startswith(BUILTIN_PREFIX) or spec.lower().endswith(".gguf") or spec.startswith(("/", ".", "~")):
        return None
    return spec if REPO_ID_RE.match(spec) and not spec.endswith((".", "-")) else None
