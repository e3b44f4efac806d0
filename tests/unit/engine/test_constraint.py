"""The grammar processor on its own: a byte-level tokenizer (tests.support.grammar), mx logits.

It is called the way mlx-lm's batch calls a processor: first with the prompt's context, then
each step with the context ending in the token sampled last, once more after EOS.
"""

from __future__ import annotations

import json
import logging

import jsonschema
import llguidance
import mlx.core as mx
import numpy as np
import pytest

from tests.support.grammar import EOS, accepts, byte_tokenizer
from vllmmlxd.engine.text.constraint import GrammarProcessor
from vllmmlxd.parsers.grammar import json_grammar

WIDTH = 260  # wider than the tokenizer's 257 ids, as a model's padded logits are


def tok() -> llguidance.LLTokenizer:
    return byte_tokenizer()


def eos() -> int:
    return tok().eos_token


def ids(text: str) -> list[int]:
    return tok().tokenize_str(text)


def processor(grammar: str, think_end: int | None = None, think_start: int | None = None) -> GrammarProcessor:
    matcher = llguidance.LLMatcher(tok(), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    think = (think_start, think_end) if think_end is not None else None
    return GrammarProcessor(matcher, tok().vocab_size, [eos()], think, "req-test")


def allowed(logits: mx.array) -> set[int]:
    return set(np.flatnonzero(np.isfinite(np.array(logits[0]))).tolist())


def step(proc: GrammarProcessor, context: list[int], logits: mx.array | None = None) -> mx.array:
    return proc(mx.array(context), mx.zeros((1, WIDTH)) if logits is None else logits)


def test_each_call_feeds_the_previous_token_then_masks_the_next():
    proc = processor('start: "ab"')
    prompt = ids("xyz")
    assert allowed(step(proc, prompt)) == set(ids("a"))  # the prompt's last token is not fed
    assert allowed(step(proc, prompt + ids("a"))) == set(ids("b"))
    assert allowed(step(proc, prompt + ids("ab"))) == {eos()}  # complete: only EOS, no padded id
    assert allowed(step(proc, prompt + ids("ab") + [eos()])) == {eos()}  # the call after EOS is harmless
    assert not proc.failed


def test_masked_logits_keep_their_values():
    proc = processor('start: "a" | "b"')
    logits = mx.arange(WIDTH, dtype=mx.float32)[None]
    out = np.array(step(proc, ids("x"), logits)[0])
    for t in ids("a") + ids("b"):
        assert out[t] == t
    assert np.isneginf(out[ids("c")[0]]) and np.isneginf(out[-1])


def test_a_refused_token_lets_only_eos_through_and_logs(caplog):
    proc = processor('start: "ab"')
    step(proc, ids("x"))
    with caplog.at_level(logging.WARNING, logger="vllmmlxd.engine"):
        out = step(proc, ids("x") + ids("q"))  # not what the mask allowed
    assert proc.failed and allowed(out) == {eos()}
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "constraint.error"]
    assert record.fields["request_id"] == "req-test" and "refused" in record.fields["error"]


def test_after_reasoning_logits_pass_untouched_until_the_end_of_thinking():
    think_end = ids("#")[0]  # stands for </think>'s id
    proc = processor('start: "ok"', think_end=think_end)
    logits = mx.arange(WIDTH, dtype=mx.float32)[None]
    context = ids("prompt")
    assert step(proc, context, logits) is logits
    for ch in "let me think":
        context += ids(ch)
        assert step(proc, context, logits) is logits
    context += [think_end]
    assert allowed(step(proc, context)) == set(ids("o"))
    context += ids("o")
    assert allowed(step(proc, context)) == set(ids("k"))


def test_after_reasoning_a_model_may_open_thinking_or_answer_at_once():
    think_start, think_end = ids("[")[0], ids("]")[0]  # stand for <think> and </think>
    # It opens thinking: free until the end of it, then held.
    proc = processor('start: "ok"', think_end=think_end, think_start=think_start)
    context = ids("prompt")
    assert allowed(step(proc, context)) == {think_start, *ids("o")}  # the first token: either
    logits = mx.arange(WIDTH, dtype=mx.float32)[None]
    for token in [think_start, *ids("hmm")]:
        context.append(token)
        assert step(proc, context, logits) is logits  # thinking: untouched
    context.append(think_end)
    assert allowed(step(proc, context)) == set(ids("o"))  # thinking ended: held
    proc2 = processor('start: "ok"', think_end=think_end, think_start=think_start)
    step(proc2, ids("p"))
    # It answers without thinking: the grammar holds from its first token on.
    assert allowed(step(proc2, ids("p") + ids("o"))) == set(ids("k"))


@pytest.mark.parametrize(
    "schema,value",
    [
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x{2}$"}}, "required": ["a"]},
            {"a": "xx"},
        ),
        ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}, [1, 2]),
    ],
)
def test_json_has_one_layout_and_no_free_whitespace(schema, value):
    # What makes a constrained value end: no run of whitespace a model could write forever.
    g = json_grammar(schema)
    jsonschema.validate(value, schema)
    assert accepts(g, json.dumps(value))
    assert not accepts(g, json.dumps(value, indent=1))
    assert not accepts(g, json.dumps(value) + " ")


def test_a_strict_schema_refuses_other_keys():
    g = json_grammar({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False})
    assert accepts(g, '{"a": 1}') and not accepts(g, '{"a": 1, "b": 2}')


def test_eos_marker_is_the_byte_tokenizers_last_id():
    assert tok().vocab_size == 257 and tok().tokenize_str(EOS, parse_special=True) == [eos()]
