"""A conversation's affinity key, per API family: the same at every turn, different between conversations."""

from __future__ import annotations

from vllmmlxd.gateway.balance import PROMPT_CHARS, affinity_key

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


def grow(first: list[dict], turns: int) -> list[list[dict]]:
    """The messages of each turn of a chat that starts with ``first``."""
    out, messages = [], list(first)
    for n in range(turns):
        out.append(list(messages))
        messages += [{"role": "assistant", "content": f"answer {n}"}, {"role": "user", "content": f"more {n}"}]
    return out


def test_an_openai_chat_keeps_its_key_as_it_grows():
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    keys = {affinity_key(CHAT, {"model": "g", "messages": m, "max_tokens": n}) for n, m in enumerate(grow(first, 4))}
    assert len(keys) == 1 and None not in keys


def test_an_anthropic_conversation_keeps_its_key_and_its_system_prompt_counts():
    turns = grow([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], 4)
    keys = {affinity_key(MESSAGES, {"system": "Be brief.", "messages": m}) for m in turns}
    assert len(keys) == 1
    other_system = affinity_key(MESSAGES, {"system": "Be verbose.", "messages": turns[0]})
    assert other_system not in keys
    # Counting a conversation's tokens names the same conversation.
    assert affinity_key("/v1/messages/count_tokens", {"system": "Be brief.", "messages": turns[2]}) in keys


def test_conversations_that_differ_before_their_first_user_message_differ():
    a = affinity_key(CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    b = affinity_key(CHAT, {"messages": [{"role": "user", "content": "hello"}]})
    c = affinity_key(CHAT, {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]})
    assert len({a, b, c}) == 3


def test_key_order_and_whitespace_of_the_body_do_not_matter():
    one = {"messages": [{"role": "user", "content": "hi", "name": "x"}]}
    two = {"messages": [{"name": "x", "content": "hi", "role": "user"}]}
    assert affinity_key(CHAT, one) == affinity_key(CHAT, two)


def test_a_completion_is_known_by_its_prompts_leading_characters():
    base = "x" * PROMPT_CHARS
    assert affinity_key("/v1/completions", {"prompt": base + "one"}) == affinity_key(
        "/v1/completions", {"prompt": base + "two, longer"}
    )
    assert affinity_key("/v1/completions", {"prompt": "a" + base}) != affinity_key("/v1/completions", {"prompt": base})
    assert affinity_key("/v1/completions", {"prompt": ["same"]}) == affinity_key("/v1/completions", {"prompt": "same"})
    assert affinity_key("/v1/completions", {"prompt": [1, 2, 3]}) is not None


def test_what_names_no_conversation_has_no_key():
    assert affinity_key(CHAT, {"messages": []}) is None
    assert affinity_key(CHAT, {"messages": "not a list"}) is None
    assert affinity_key("/v1/completions", {"prompt": ""}) is None
    assert affinity_key("/v1/completions", {}) is None
    assert affinity_key("/v1/embeddings", {"input": "hi"}) is None
