"""What `vllmmlxctl pull` accepts: repo ids and hub URLs, read into a repo and a revision."""

import pytest

from vllmmlxd.errors import StoreError
from vllmmlxd.store.sources import Source, parse_source


@pytest.mark.parametrize(
    "text,revision,expected",
    [
        ("mlx-community/Qwen3-0.6B-4bit", None, Source("mlx-community/Qwen3-0.6B-4bit")),
        ("org/name", "v2", Source("org/name", "v2")),
        ("https://huggingface.co/org/name", None, Source("org/name")),
        ("https://huggingface.co/org/name/", None, Source("org/name")),
        ("huggingface.co/org/name", None, Source("org/name")),
        ("https://hf.co/org/name.git", None, Source("org/name")),
        ("https://huggingface.co/models/org/name", None, Source("org/name")),
        ("https://huggingface.co/org/name/tree/dev", None, Source("org/name", "dev")),
        ("https://huggingface.co/org/name/tree/refs%2Fpr%2F3", None, Source("org/name", "refs/pr/3")),
        ("https://huggingface.co/org/name/blob/abc123/config.json", None, Source("org/name", "abc123")),
        ("https://huggingface.co/org/name/tree/dev", "dev", Source("org/name", "dev")),
        ("https://huggingface.co/org/name?library=mlx#files", None, Source("org/name")),
        ("http://127.0.0.1:9999/org/name", None, Source("org/name")),  # the endpoint's own URL
    ],
)
def test_repo_ids_and_hub_urls_are_read(text, revision, expected):
    assert parse_source(text, revision, endpoint="http://127.0.0.1:9999") == expected


@pytest.mark.parametrize(
    "text,revision,says",
    [
        ("gpt2", None, "is not a Hugging Face model repo id"),
        ("a/b/c", None, "is not a Hugging Face model repo id"),
        ("./models/x", None, "is not a Hugging Face model repo id"),
        ("https://example.com/org/name", None, "example.com is not the Hugging Face hub"),
        ("https://huggingface.co/datasets/org/data", None, "is a dataset, not a model"),
        ("https://huggingface.co/spaces/org/app", None, "is a space, not a model"),
        ("https://huggingface.co/org", None, "names no model"),
        ("https://huggingface.co/org/name/settings", None, "names no model"),
        ("https://huggingface.co/org--x/name", None, "is not a valid repo id"),
        ("org/name", "bad rev", "is not a branch, tag or commit name"),
        ("org/name", "", "is not a branch, tag or commit name"),
        ("https://huggingface.co/org/name/tree/dev", "main", "give one of the two"),
    ],
)
def test_anything_else_is_refused_saying_what_is_accepted(text, revision, says):
    with pytest.raises(StoreError, match=says):
        parse_source(text, revision)


def test_a_source_renders_as_it_would_be_typed():
    assert Source("org/name").render() == "org/name" and Source("org/name", "v1").render() == "org/name@v1"
