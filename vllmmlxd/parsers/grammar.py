"""JSON inside Lark grammars (llguidance's dialect), laid out the same everywhere. Pure.

llguidance lets JSON have any whitespace between tokens by default, and a model (a random one
at once, a real one sometimes) can then write spaces or newlines until ``max_tokens``. The
JSON compiler reads its options from the schema's ``x-guidance`` key (Lark-level options do
not reach ``%json``): no free whitespace, and the separators ``json.dumps`` writes, which is
what models saw in training.

Objects hold only the keys their schema declares: a schema's ``properties`` are all an object
may have unless the schema itself says otherwise (``additionalProperties``,
``patternProperties``, ``unevaluatedProperties``), as OpenAI's strict function calling does.
JSON Schema's default (any other key, any value) lets a model invent keys (a random-weight
model wrote one named ``","``); an answer without them still validates against the schema the
client sent. An object schema that declares no properties (``json_object``) stays open, and
so do schemas that are combined with others (``allOf``, ``$ref`` beside properties), where
closing one part would refuse the keys of another.

Termination: once the value is complete the grammar admits nothing else, so a value whose
strings, arrays and numbers are bounded always ends; an unbounded string can run to
``max_tokens`` (the request then ends with ``length``).
"""

from __future__ import annotations

import json
from typing import overload

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# Keywords whose value is one subschema, a list of them, or a map of names to them.
_ONE = (
    "items",
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_LIST = ("prefixItems", "anyOf", "oneOf")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN_BY_SCHEMA = ("additionalProperties", "patternProperties", "unevaluatedProperties")
MAX_WALK_DEPTH = 64  # deeper parts are left as they are (the API bounds an output schema at 32)


def json_rule(schema: dict) -> str:
    """A Lark expression of one JSON value held to ``schema`` (``%json {...}``), its objects
    closed to undeclared keys (``declared_only``)."""
    return "%json " + json.dumps({**declared_only(schema), "x-guidance": JSON_LAYOUT}, ensure_ascii=False)


@overload
def declared_only(schema: dict, *, closable: bool = True, depth: int = 0) -> dict: ...
@overload
def declared_only(schema: object, *, closable: bool = True, depth: int = 0) -> object: ...
def declared_only(schema: object, *, closable: bool = True, depth: int = 0) -> object:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and says nothing of other keys (see the module's docstring). Pure: a copy."""
    if not isinstance(schema, dict) or depth > MAX_WALK_DEPTH:
        return schema
    out = dict(schema)
    for key in _ONE:
        if key in out:
            out[key] = declared_only(out[key], depth=depth + 1)
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [declared_only(s, depth=depth + 1) for s in out[key]]
    if isinstance(out.get("allOf"), list):  # its parts add up: none may refuse another's keys
        out["allOf"] = [declared_only(s, closable=False, depth=depth + 1) for s in out["allOf"]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: declared_only(s, depth=depth + 1) for name, s in out[key].items()}
    if (
        closable
        and isinstance(out.get("properties"), dict)
        and "allOf" not in out
        and "$ref" not in out
        and not any(k in out for k in _OPEN_BY_SCHEMA)
    ):
        out["additionalProperties"] = False
    return out


def json_grammar(schema: dict) -> str:
    """A whole grammar: one JSON value held to ``schema``, nothing before or after."""
    return "start: " + json_rule(schema)
