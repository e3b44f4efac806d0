"""Structured output: a request's ``response_format`` as a grammar the engine enforces while
decoding, and the check of the result against its schema. Pure.

The grammar is llguidance's Lark with the schema inlined, laid out as ``json.dumps`` writes
it (``parsers.grammar``: a model free to choose its whitespace can fill its budget with
spaces). A schema is checked here first (a valid JSON Schema, bounded in size
and depth), then compiled by the engine before the request is queued, so a bad one is a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..engine.types import Constraint
from ..errors import InvalidRequest, RequestError
from ..parsers.grammar import json_grammar

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32


class ConstraintFailed(InvalidRequest):
    """The request's grammar (its schema, its forced call) could not be held while decoding:
    a 400 saying why, never a server error. (A schema that cannot even start is refused before
    decoding, by the engine's check.)"""

    def __init__(self, message: str):
        super().__init__(message, code="constraint_failed")


class OutputCheckFailed(RequestError):
    """A grammar-held answer that still fails its schema: the server's shortcoming (500), named."""

    status_code = 500
    error_type = "server_error"

    def __init__(self, message: str):
        super().__init__(message, code="output_check_failed")


@dataclass(frozen=True)
class OutputFormat:
    """What the answer must be: any JSON object, or JSON valid against ``schema``."""

    schema: dict[str, Any]
    param: str  # where the request said so, for errors

    def constraint(self, *, after_reasoning: bool) -> Constraint:
        return Constraint(json_grammar(self.schema), after_reasoning=after_reasoning)

    def problem(self, text: str) -> str | None:
        """Why ``text`` is not what was asked for, or None when it is."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"the output is not JSON: {exc}"
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self.schema).iter_errors(value))
        return None if error is None else f"the output does not match the schema: {error.message}"


def ensure_valid(output: OutputFormat | None, text: str, reason: str) -> None:
    """The whole answer is checked against its schema before it is returned. A grammar-held
    answer that ended by itself and still fails is the server's fault: a 500 that says why, never bad data."""
    if output is None or reason != "stop":  # cut by max_tokens: the finish reason tells the truth
        return
    problem = output.problem(text)
    if problem:
        raise OutputCheckFailed(f"the structured output failed its check: {problem}")


def openai_output_format(
    fmt: dict[str, Any] | None, where: str = "response_format", flat: bool = False
) -> OutputFormat | None:
    """OpenAI's output format: ``text`` (None), ``json_object`` or ``json_schema``. Chat's
    ``response_format`` nests the schema under ``json_schema``; the Responses API's ``text.format``
    (``where``) is ``flat``: ``name``, ``schema`` and ``strict`` beside ``type``, the schema required."""
    if not fmt:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat({"type": "object"}, where)
    if kind == "json_schema":
        spec: Any
        if flat:
            spec, at = fmt, f"{where}.schema"
            if not isinstance(fmt.get("schema"), dict):
                raise InvalidRequest(f"{at} must be a JSON schema object", param=at)
            schema = fmt["schema"]
        else:
            spec, at = fmt.get("json_schema"), f"{where}.json_schema.schema"
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise InvalidRequest(
                    f"{where}.json_schema must be an object with a schema", param=f"{where}.json_schema"
                )
            schema = spec.get("schema") or {"type": "object"}
        if spec.get("strict") and schema.get("type") == "object" and "additionalProperties" not in schema:
            schema = {**schema, "additionalProperties": False}  # strict: no keys beyond the schema's
        return OutputFormat(checked_schema(schema, at), at)
    raise InvalidRequest(
        f"{where} type {kind!r} is not supported; use text, json_object or json_schema", param=f"{where}.type"
    )


def anthropic_output_format(output_format: dict[str, Any] | None) -> OutputFormat | None:
    """Anthropic's ``output_format``: ``{"type": "json_schema", "schema": {...}}``."""
    if not output_format:
        return None
    if output_format.get("type") != "json_schema":
        raise InvalidRequest("output_format type must be json_schema", param="output_format.type")
    return OutputFormat(checked_schema(output_format.get("schema"), "output_format.schema"), "output_format.schema")


def checked_schema(schema: Any, param: str) -> dict[str, Any]:
    """``schema`` if it is a JSON Schema this server will compile: valid, and bounded."""
    if not isinstance(schema, dict):
        raise InvalidRequest("a schema must be a JSON object", param=param)
    # Depth first: json.dumps, like every walk after it, recurses, and a body may nest to the parser's limit.
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels", param=param)
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(f"the schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB", param=param)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"the schema is not valid JSON Schema: {exc.message}", param=param) from None
    return schema


def _depth(value: Any) -> int:
    """How deep ``value`` nests, found with a loop: recursion would fail first on a deep one."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_SCHEMA_DEPTH:  # past the limit the answer is known: stop walking
                stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest
