"""Reading what parses of a JSON object cut short (parsers.partial_json)."""

from __future__ import annotations

import pytest

from vllmmlxd.parsers.partial_json import partial_object


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"city": "Paris"}', {"city": "Paris"}),
        ('{"city": "Pa', {"city": "Pa"}),
        ('{"city": "Paris", "da', {"city": "Paris"}),
        ('{"city": "Paris", "days": ', {"city": "Paris"}),
        ('{"tags": ["a", "b', {"tags": ["a", "b"]}),
        ('{"a": {"b": 1}, "c": tr', {"a": {"b": 1}}),
        ('{"a": "x\\', {"a": "x"}),
        ('{"city": ', {}),
        ("{", {}),
    ],
)
def test_what_parses_of_a_cut_object(text, expected):
    assert partial_object(text) == expected


@pytest.mark.parametrize("text", ["", "no object here", "[1, 2"])
def test_no_object_is_none(text):
    assert partial_object(text) is None
