"""JSON inside Lark grammars (llguidance's dialect), laid out the same everywhere. Pure.

llguidance lets JSON have any whitespace between tokens by default, and a model (a random one
at once, a real one sometimes) can then write spaces or newlines until ``max_tokens``. The
JSON compiler reads its options from the schema's ``x-guidance`` key (Lark-level options do
not reach ``%json``): no free whitespace, and the separators ``json.dumps`` writes, which is
what models saw in training.

Termination: once the value is complete the grammar admits nothing else, so a value whose
strings, arrays and numbers are bounded always ends; an unbounded string can run to
``max_tokens`` (the request then ends with ``length``).
"""

from __future__ import annotations

import json

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_rule(schema: dict) -> str:
    """A Lark expression of one JSON value held to ``schema`` (``%json {...}``)."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT}, ensure_ascii=False)


def json_grammar(schema: dict) -> str:
    """A whole grammar: one JSON value held to ``schema``, nothing before or after."""
    return "start: " + json_rule(schema)
