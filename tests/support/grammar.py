"""Check a Lark grammar (llguidance's dialect) without a model: a byte-level tokenizer of 256
byte tokens plus an end token, and a matcher that walks a text through it byte by byte."""

from __future__ import annotations

import functools
import json
import tempfile

import llguidance
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

EOS = "<|end|>"


@functools.cache
def byte_tokenizer() -> llguidance.LLTokenizer:
    """Every byte is a token (ByteLevel's alphabet), id 256 ends the text."""
    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        path = f.name
    tok.save(path)
    return llguidance.LLTokenizer(path, eos_token=tok.token_to_id(EOS))


def compile_error(grammar: str) -> str | None:
    """Why llguidance refuses ``grammar``, or None when it compiles."""
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(grammar), byte_tokenizer()
    )
    return "; ".join(messages) if failed else None


def accepts(grammar: str, text: str) -> bool:
    """Does ``grammar`` accept exactly ``text`` (all of it, and may it end there)?"""
    tokenizer = byte_tokenizer()
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    if matcher.is_error():
        raise AssertionError(matcher.get_error())
    for token in tokenizer.tokenize_str(text):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


def json_lark(schema: dict) -> str:
    """A grammar of one JSON value held to ``schema``."""
    return f"start: %json {json.dumps(schema)}"
