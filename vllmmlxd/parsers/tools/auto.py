"""Any family, told from the text itself: ``tool_call_parser: auto``.

The first start marker written picks the family, which then reads the rest of the answer:
``<tool_call>`` qwen (hermes JSON or Qwen3-Coder XML), ``[TOOL_CALLS]`` mistral,
``<|python_tag|>`` / ``<|python_start|>`` llama, ``<｜tool▁calls▁begin｜>`` /
``<｜tool▁call▁begin｜>`` deepseek, ``<|tool_calls_section_begin|>`` kimi. Until then only
a trailing prefix of some marker is held back. Bare calls with no marker (Llama's JSON or
pythonic answers) are not guessed at: name ``llama`` for those.

``render_call`` and ``grammar`` are hermes': with no family known, that is the format most
models read. ``family_for_template`` picks a family from a model's chat template (and its
special tokens), for the engine to resolve ``auto`` when it loads a model.
"""

from __future__ import annotations

from vllmmlxd.parsers.tools import deepseek, harmony, hermes, kimi, llama, mistral, qwen
from vllmmlxd.parsers.tools.base import Piece, ToolParser

# Start marker -> the family that reads from it.
_FAMILIES: dict[str, type[ToolParser]] = {
    hermes.HermesToolParser.start: qwen.Parser,
    mistral.Parser.start: mistral.Parser,
    **{marker: llama.Parser for marker in llama.Parser.starts},
    **{marker: deepseek.Parser for marker in deepseek.Parser.starts},
    **{marker: kimi.Parser for marker in kimi.Parser.starts},
}


class AutoToolParser(ToolParser):
    name = "auto"
    starts = tuple(_FAMILIES)
    markers = frozenset().union(*(family.markers for family in _FAMILIES.values()))

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self.family: ToolParser | None = None  # the family chosen by the first marker

    def feed(self, text: str) -> list[Piece]:
        if self.family is not None:
            return self._counted(self.family.feed(text))
        out: list[Piece] = []
        buf, self._held = self._held + text, ""
        at, marker = self._find_start(buf)
        if marker:
            self._content(out, buf[:at])
            self.family = _FAMILIES[marker](self.tools)
            for piece in self._counted(self.family.feed(buf[at:])):
                if piece[0] == "content":
                    self._content(out, piece[1])
                else:
                    out.append(piece)
            return out
        keep = self._start_prefix(buf)
        self._content(out, buf[: len(buf) - keep])
        self._held = buf[len(buf) - keep :]
        return out

    def finish(self) -> list[Piece]:
        if self.family is not None:
            return self._counted(self.family.finish())
        held, self._held = self._held, ""
        return [("content", held)] if held else []

    def _counted(self, pieces: list[Piece]) -> list[Piece]:
        assert self.family is not None  # called with the chosen family's pieces
        self.calls = self.family.calls
        return pieces

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return hermes.Parser.render_call(name, arguments)

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        return hermes.Parser.grammar(tools, parallel=parallel)


# What a chat template (or a tokenizer's special tokens) writes -> the family, most specific
# first: several families wrap calls in <tool_call>, so the plain tag comes last.
_TEMPLATE_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen", ("<tool_call>\n<function=", "<function=")),
    ("glm47", ("<arg_key>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("deepseek", (deepseek.CALLS_BEGIN, deepseek.CALL_BEGIN)),
    ("kimi", (kimi.SECTION_BEGIN, kimi.CALL_BEGIN)),
    ("llama", (llama.PYTHON_TAG, llama.PYTHON_START)),
    ("granite", ("<|tool_call|>",)),
    ("nemotron", ("<TOOLCALL>",)),
    ("hermes", ("<tool_call>",)),
)
# Tokens that name a family when the template says nothing (checked in the order above).
_VOCAB_SIGNS = {
    "glm47": "<arg_key>",
    "mistral": "[TOOL_CALLS]",
    "deepseek": deepseek.CALLS_BEGIN,
    "kimi": kimi.SECTION_BEGIN,
    "llama": llama.PYTHON_TAG,
    "granite": "<|tool_call|>",
    "nemotron": "<TOOLCALL>",
    "hermes": "<tool_call>",
}


def family_for_template(chat_template: str | None, vocab: set[str] | None = None) -> str | None:
    """The tool-call family a model writes, from its chat template, else its (special) tokens;
    None when neither tells."""
    template = chat_template or ""
    if harmony.CHANNEL in template or harmony.speaks_harmony(vocab):  # GPT-OSS: channels, whatever else it says
        return "harmony"
    for family, signs in _TEMPLATE_SIGNS:
        # Qwen3-Coder's XML lives inside <tool_call>; other "<function=" formats are not Qwen's.
        if family == "qwen" and "<tool_call>" not in template:
            continue
        if any(sign in template for sign in signs):
            return family
    # A Llama 3 template that asks for {"name": ..., "parameters": ...} without a python tag.
    if ("<|start_header_id|>" in template or "<|header_start|>" in template) and '"parameters"' in template:
        return "llama"
    for family, token in _VOCAB_SIGNS.items():
        if vocab and token in vocab:
            return family
    return None


Parser = AutoToolParser
