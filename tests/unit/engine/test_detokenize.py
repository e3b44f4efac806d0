"""detokenize.py with the real SmolLM2 tokenizer (builtin:tiny's): streamed text equals decoded text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.engine.text.detokenize import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tok(state_dir):
    return Tokenizer.from_file(str(ensure_builtin("tiny", state_dir) / "tokenizer.json"))


def stream(tok, ids, context=()):
    d = IncrementalDetokenizer(lambda xs: tok.decode(xs, skip_special_tokens=False), list(context))
    out = ""
    for i in ids:
        d.add_token(i)
        out += d.last_segment
    d.finalize()
    return out + d.last_segment


def test_a_completion_keeps_its_leading_space(tok):
    prompt = tok.encode("The capital of France is").ids
    answer = tok.encode(" Paris, of course.").ids
    assert stream(tok, answer, prompt) == " Paris, of course."


def test_multibyte_characters_split_across_tokens_arrive_whole(tok):
    text = "naïve café 東京 🙂 done"
    ids = tok.encode(text).ids
    d = IncrementalDetokenizer(lambda xs: tok.decode(xs), [])
    pieces = []
    for i in ids:
        d.add_token(i)
        pieces.append(d.last_segment)
    d.finalize()
    pieces.append(d.last_segment)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=60))
def test_streaming_any_text_gives_the_text(tok, text):
    ids = tok.encode(text).ids
    assert stream(tok, ids) == tok.decode(ids)
