"""The contract every tool-call family's parser keeps, run over each family's cases
(tool_families/): its texts give the same pieces whole and split at every boundary, a plain
answer, a malformed call and a call of an unknown tool are given back as text, calls are counted
and their arguments are a JSON object's text, what render_call writes is read back, the markers
are the format's special tokens, and the grammar holds a forced call to the format and each
tool's schema."""

from __future__ import annotations

import json

import pytest

from tests.support.grammar import accepts, compile_error
from tests.unit.parsers.tool_families import FAMILIES, TOOLS, Family
from tests.unit.parsers.tool_split import assert_splits_agree, call, feed_all
from vllmmlxd.parsers.tools import TOOL_PARSERS

EVERY_FAMILY = pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
EVERY_CASE = pytest.mark.parametrize(
    ("family", "text", "expected", "tools"),
    [
        pytest.param(family, text, expected, tools, id=f"{family.name}: {name}")
        for family in FAMILIES.values()
        for name, text, expected, tools in family.cases()
    ],
)


def test_every_family_is_held_to_the_contract():
    """Each parser family has its cases, and each states every kind of case the contract reads."""
    assert sorted(FAMILIES) == sorted(TOOL_PARSERS)
    for family in FAMILIES.values():
        assert family.calls and family.plain and family.malformed and family.unknown_tool, family.name
        assert family.tools[: len(TOOLS)] == TOOLS, family.name
        names = [name for name, *_ in family.cases()]
        assert len(names) == len(set(names)), family.name


@EVERY_CASE
def test_golden_split_at_every_boundary(family: Family, text, expected, tools):
    """The pieces of the text, whole, one character at a time and split anywhere in two."""
    assert_splits_agree(family.name, tools, text, expected, **family.options)


@EVERY_CASE
def test_calls_are_counted_and_their_arguments_are_json_objects(family: Family, text, expected, tools):
    """``calls`` counts the calls emitted; each call's arguments are the text of a JSON object."""
    parser, pieces = feed_all(family.name, tools, [text], **family.options)
    calls = [value for kind, value in pieces if kind == "tool_call"]
    assert parser.calls == len(calls)
    for got in calls:
        assert isinstance(json.loads(got.arguments), dict)


@EVERY_FAMILY
def test_render_call_is_read_back(family: Family):
    """What render_call writes (for few-shot instructions) the parser reads back as that call."""
    name, arguments = family.render
    text = family.parser.render_call(name, arguments)
    if family.rendered is not None:
        assert text == family.rendered
    assert_splits_agree(family.name, family.tools, text, [call(name, json.dumps(arguments))], **family.options)


@EVERY_FAMILY
def test_markers_are_the_special_tokens(family: Family):
    """The markers (the special tokens the engine must decode for the parser) are the format's."""
    assert family.parser.markers == family.markers


@EVERY_FAMILY
def test_grammar_compiles_and_accepts_what_the_family_writes(family: Family):
    P = family.parser
    g = P.grammar(family.tools)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    for text in family.grammar_accepts:
        assert accepts(g, text), text


@EVERY_FAMILY
def test_grammar_refuses_what_the_schema_refuses(family: Family):
    P = family.parser
    g = P.grammar(family.tools)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("rm_rf", {}))  # no such tool
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))  # a forced call is all there is
    for text in family.grammar_refuses:
        assert not accepts(g, text), text


@EVERY_FAMILY
def test_one_call_only_unless_parallel(family: Family):
    """``parallel=False`` allows one call, not two; the parallel grammar allows two where the format has them."""
    P = family.parser
    one = P.grammar(family.tools, parallel=False)
    assert accepts(one, P.render_call("get_time", {}))
    for two in family.two_calls:
        assert not accepts(one, two), two
        assert accepts(P.grammar(family.tools), two) == family.parallel, two
