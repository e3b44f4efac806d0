"""Prefix-cache salts (issue 37): a salted request's cache key differs from another salt's in its
first id only, so none of its blocks (nor their names on disk) is ever another salt's, and every
position's KV stays where it was."""

from __future__ import annotations

from vllmmlxd.api.prompt import cache_salt
from vllmmlxd.engine.cache.block_tree import DIGEST_BYTES, chain_digest, token_bytes
from vllmmlxd.engine.step.sequence import prompt_key
from vllmmlxd.engine.types import GenerationRequest, SamplingParams

PROMPT = list(range(1, 100))


def key(salt: str | None) -> list[int]:
    return prompt_key(GenerationRequest(PROMPT, SamplingParams(), cache_salt=salt))


def test_a_salt_changes_the_first_id_alone_and_the_same_salt_the_same_way():
    alice, bob = key("key:alice"), key("key:bob")
    assert key(None) == PROMPT and alice == key("key:alice")
    assert alice[0] != bob[0] and alice[0] < 0 and bob[0] < 0  # never a real token
    assert alice[1:] == bob[1:] == PROMPT[1:]
    root = bytes(DIGEST_BYTES)
    first = [chain_digest(root, token_bytes(k[:32])) for k in (alice, bob, PROMPT)]
    assert len(set(first)) == 3  # the blocks' names on disk chain from a different first block


def test_the_salt_is_the_key_s_by_the_entry_s_scope_and_the_request_s_own():
    assert cache_salt("key", "alice", None) == "key:alice"
    assert cache_salt("key", "alice", "p1") == "key:alice\0salt:p1"
    assert cache_salt("entry", "alice", None) is None  # shared by every key of the entry
    assert cache_salt("entry", "alice", "p1") == "salt:p1"
    assert cache_salt("key", None, None) is None  # an open entry has no keys to keep apart
