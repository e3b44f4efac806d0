"""Fill-in-the-middle (read by the engine at load, written by the API for a ``suffix``): the prompt forms code models were trained on to write what goes between a
prefix and a suffix, told apart by the control tokens their tokenizers carry. Pure.

- ``qwen`` (Qwen2.5-Coder, Qwen3-Coder): ``<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>``
- ``starcoder`` (StarCoder, StarCoder2, SantaCoder): ``<fim_prefix>P<fim_suffix>S<fim_middle>``
- ``deepseek`` (DeepSeek-Coder): ``<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>``
- ``codestral`` (Codestral, Mistral's code models): ``[SUFFIX]S[PREFIX]P`` (the suffix first)
"""

from __future__ import annotations

from collections.abc import Callable, Collection

FIM_FORMS: dict[str, tuple[tuple[str, ...], Callable[[str, str], str]]] = {
    "qwen": (
        ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
        lambda p, s: f"<|fim_prefix|>{p}<|fim_suffix|>{s}<|fim_middle|>",
    ),
    "starcoder": (
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        lambda p, s: f"<fim_prefix>{p}<fim_suffix>{s}<fim_middle>",
    ),
    "deepseek": (
        ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
        lambda p, s: f"<｜fim▁begin｜>{p}<｜fim▁hole｜>{s}<｜fim▁end｜>",
    ),
    "codestral": (("[SUFFIX]", "[PREFIX]"), lambda p, s: f"[SUFFIX]{s}[PREFIX]{p}"),
}


def detect_fim(vocab: Collection[str]) -> str | None:
    """The fill-in-the-middle form whose control tokens are all in ``vocab``; None: the model has none."""
    for name, (tokens, _) in FIM_FORMS.items():
        if all(t in vocab for t in tokens):
            return name
    return None


def fim_prompt(form: str, prefix: str, suffix: str) -> str:
    """The prompt text that asks a model of ``form`` for what goes between ``prefix`` and ``suffix``."""
    return FIM_FORMS[form][1](prefix, suffix)
