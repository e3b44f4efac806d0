"""Constrained decoding on the real engine: builtin:tiny (random weights) in this process, on MLX.

A random model at temperature 1 is the hardest writer of JSON there is: whatever it writes
under a grammar must still parse and validate. The schemas bound every string, array and
integer, so the grammar always ends (then only EOS is allowed) well within max_tokens.
"""

from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import pytest

from vllmmlxd.engine.loading.loader import load_model
from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.options import EngineOptions
from vllmmlxd.engine.types import Constraint, Finished, GenerationRequest, SamplingParams, TextDelta
from vllmmlxd.parsers.grammar import json_grammar
from vllmmlxd.parsers.tools import tool_parser_class

THINK_START, THINK_END = 49152, 49153  # <think> and </think> in builtin:tiny's vocabulary
SEEDS = (1, 2, 3)

TAGS = {  # (a) a required array of strings
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 4}
    },
    "required": ["tags"],
    "additionalProperties": False,
}
PERSON = {  # (b) nested objects, enums, bounded integers
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "country": {"enum": ["FR", "DE", "JP"]},
                "zip": {"type": "integer", "minimum": 1000, "maximum": 99999},
                "kind": {"type": "string", "enum": ["home", "work"]},
            },
            "required": ["country", "zip", "kind"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
ITEMS = {  # (c) an array of objects
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "done": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 10},
        },
        "required": ["id", "done"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 3,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def engine(state_dir):
    eng = MLXEngine(load_model("builtin:tiny", state_dir), options=EngineOptions(max_num_seqs=8))
    yield eng
    eng.close()


async def collect(engine: MLXEngine, request: GenerationRequest) -> tuple[str, Finished]:
    text = []
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            return "".join(text), event
    raise AssertionError("no Finished event")


def run(engine: MLXEngine, *requests: GenerationRequest) -> list[tuple[str, Finished]]:
    async def all_of() -> list:
        return await asyncio.gather(*(collect(engine, r) for r in requests))

    return asyncio.run(all_of())


def request(
    engine,
    grammar: str | None,
    *,
    seed: int | None = 1,
    temperature: float = 1.0,
    max_tokens: int = 400,
    prompt: str = "Answer in JSON:",
    after_reasoning: bool = False,
    **sampling,
) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, **sampling)
    constraint = Constraint(grammar, after_reasoning) if grammar is not None else None
    return GenerationRequest(engine.tokenize(prompt), params, constraint=constraint)


@pytest.mark.parametrize("schema", [TAGS, PERSON, ITEMS], ids=["string-array", "nested-enums", "array-of-objects"])
def test_output_is_valid_json_of_the_schema_at_temperature_one(engine, schema):
    grammar = json_grammar(schema)
    results = run(engine, *(request(engine, grammar, seed=s) for s in SEEDS))
    for text, finished in results:
        assert finished.reason == "stop", (text, finished)  # the grammar ended, then EOS: not max_tokens
        jsonschema.validate(json.loads(text), schema)
    assert len({text for text, _ in results}) == len(SEEDS)  # each seed wrote its own value


def test_any_json_object(engine):
    text, finished = run(engine, request(engine, json_grammar({"type": "object"}), temperature=0, max_tokens=64))[0]
    # Free strings can run to max_tokens with a random model; what was written is still a JSON start.
    assert text.startswith("{")
    if finished.reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_forced_hermes_call_is_read_back_as_a_valid_call(engine):
    parser_class = tool_parser_class("hermes")
    grammar = parser_class.grammar([WEATHER], parallel=False)
    for seed in SEEDS:
        text, finished = run(engine, request(engine, grammar, seed=seed))[0]
        assert finished.reason == "stop", (text, finished)
        parser = parser_class([WEATHER])
        pieces = parser.feed(text) + parser.finish()
        calls = [p[1] for p in pieces if p[0] == "tool_call"]
        assert [c.name for c in calls] == ["get_weather"], pieces
        assert all(p[1].strip() == "" for p in pieces if p[0] == "content"), pieces
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])


def test_constrained_and_free_requests_share_a_batch(engine):
    free = dict(grammar=None, temperature=0, seed=None, max_tokens=40, ignore_eos=True, prompt="Once upon a time")
    alone, _ = run(engine, request(engine, **free))[0]
    before = engine.stats.steps_executed
    results = run(
        engine,
        request(engine, json_grammar(PERSON), seed=7),
        request(engine, **free),
        request(engine, json_grammar(TAGS), seed=8),
    )
    steps = engine.stats.steps_executed - before
    (person, _p_done), (batched, f_done), (tags, _t_done) = results
    assert batched == alone and f_done.usage.completion_tokens == 40
    jsonschema.validate(json.loads(person), PERSON)
    jsonschema.validate(json.loads(tags), TAGS)
    assert steps < sum(r[1].usage.completion_tokens for r in results)  # they decoded together


def test_the_grammar_overrides_a_logit_bias(engine):
    # A bias that would make every token </think>: the mask comes after it, so JSON still comes out.
    text, finished = run(engine, request(engine, json_grammar(TAGS), logit_bias=((THINK_END, 100.0),)))[0]
    assert finished.reason == "stop"
    jsonschema.validate(json.loads(text), TAGS)


def test_after_reasoning_the_grammar_starts_after_the_end_of_thinking(engine):
    # The bias forces </think> as the first token (nothing masks it yet), then the grammar holds.
    biased = request(engine, json_grammar(TAGS), after_reasoning=True, logit_bias=((THINK_END, 100.0),))
    text, finished = run(engine, biased)[0]
    assert finished.reason == "stop" and finished.usage.completion_tokens > 1
    answer = text.split("</think>", 1)[-1]  # the special token's text may or may not be shown
    jsonschema.validate(json.loads(answer), TAGS)
    # Once it opened thinking (the bias makes <think> its first token), the model writes freely
    # until </think>: greedy text is what it is unconstrained.
    free = dict(temperature=0, seed=None, max_tokens=12, ignore_eos=True, logit_bias=((THINK_START, 100.0),))
    waiting, _ = run(engine, request(engine, json_grammar(TAGS), after_reasoning=True, **free))[0]
    unconstrained, _ = run(engine, request(engine, None, **free))[0]
    assert waiting == unconstrained and waiting.startswith("<think>")


def test_check_constraint_refuses_bad_grammars_quickly(engine):
    assert engine.check_constraint(Constraint(json_grammar(PERSON))) is None
    assert "unknown name" in engine.check_constraint(Constraint("start: nowhere"))
    assert "JSON schema" in engine.check_constraint(Constraint(json_grammar({"type": "nope"})))
    assert "regex" in engine.check_constraint(Constraint(json_grammar({"type": "string", "pattern": "("})))
    deep: dict = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"x": deep}, "required": ["x"]}
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": "[a-z]{1,20}@[a-z]{2,8}"} for i in range(10_000)},
    }
    # Valid, recursive, and slow to compile (seconds): refused once the compile budget is spent.
    huge = {
        "$defs": {
            "n": {
                "anyOf": [
                    {"type": "array", "items": {"$ref": "#/$defs/n"}},
                    {"type": "object", "properties": {f"k{i}": {"$ref": "#/$defs/n"} for i in range(6000)}},
                ]
            }
        },
        "$ref": "#/$defs/n",
    }
    for schema, why in ((deep, "recursion limit"), (wide, "too large"), (huge, "too long to compile")):
        grammar = json_grammar(schema)
        started = time.perf_counter()
        error = engine.check_constraint(Constraint(grammar))
        # The compile budget (0.5 s) and what a loaded two-core machine adds to waking up after
        # it (1.05 s was seen); the huge schema's whole compile takes 3.4 s on a quiet one.
        assert time.perf_counter() - started < 2.0 and why in (error or ""), error


def test_a_request_with_a_bad_grammar_ends_with_an_error_not_the_batch(engine):
    free = request(engine, None, temperature=0, seed=None, max_tokens=8, ignore_eos=True)
    (_, bad), (_, good) = run(engine, request(engine, "start: nowhere"), free)
    assert bad.reason == "error" and "unknown name" in bad.error
    assert good.reason == "length" and good.usage.completion_tokens == 8


def test_a_schema_with_no_finite_value_is_refused_by_the_check(engine):
    assert "no output can satisfy" in (engine.check_constraint(Constraint(json_grammar({"$ref": "#"}))) or "")


def test_a_grammar_that_fails_while_decoding_ends_its_request_with_a_constraint_error(engine):
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}  # starts, then cannot go on
    free = request(engine, None, temperature=0, seed=None, max_tokens=8, ignore_eos=True)
    (_, bad), (_, good) = run(engine, request(engine, json_grammar(endless)), free)
    assert bad.reason == "error" and bad.error_kind == "constraint" and "grammar" in bad.error
    assert good.reason == "length" and good.usage.completion_tokens == 8


def test_a_grammar_that_does_not_compile_on_the_engine_thread_is_a_constraint_error(engine):
    # The API checks first; a grammar that still fails to compile when the request starts
    # (evicted from the cache, then too slow) ends that request as the client's error.
    ((_, bad),) = run(engine, request(engine, "start: nowhere"))
    assert bad.reason == "error" and bad.error_kind == "constraint" and "unknown name" in bad.error
