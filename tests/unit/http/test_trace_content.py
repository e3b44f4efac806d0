"""A span's content when the operator asks for it (http/trace_content.py): every family's request
body as the generative-AI conventions' messages, text only, each part bounded."""

from __future__ import annotations

import json

from vllmmlxd.http.trace_content import PART_CHARS, input_messages, output_messages


def shown(body: dict) -> list[dict]:
    return json.loads(input_messages(json.dumps(body).encode()) or "[]")


def test_chat_messages_with_text_and_an_image():
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            },
        ]
    }
    assert shown(body) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What is this?"}, {"type": "image_url"}]},
    ]


def test_anthropic_responses_completions_and_ollama_bodies():
    assert shown({"system": "S", "messages": [{"role": "user", "content": "hi"}]})[0] == {
        "role": "system",
        "parts": [{"type": "text", "content": "S"}],
    }
    assert [m["role"] for m in shown({"instructions": "I", "input": "q"})] == ["system", "user"]
    listed = shown({"input": [{"role": "user", "content": [{"type": "input_text", "text": "q"}]}]})
    assert listed == [{"role": "user", "parts": [{"type": "text", "content": "q"}]}]
    assert shown({"prompt": "Once"}) == [{"role": "user", "parts": [{"type": "text", "content": "Once"}]}]
    assert input_messages(b"not json") is None and input_messages(b"{}") is None


def test_a_long_part_is_cut_and_the_answer_has_its_finish_reason():
    [message] = shown({"prompt": "x" * (PART_CHARS + 10)})
    assert len(message["parts"][0]["content"]) == PART_CHARS
    assert json.loads(output_messages("Hello", "stop")) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Hello"}], "finish_reason": "stop"}
    ]
