"""Log-probabilities in each API's words: chat's content entries, completions' parallel lists with
text offsets, token ids on request, -inf as a finite floor, and a stream's chunks carrying the
entries of the tokens their text came from."""

from __future__ import annotations

import json
import math

from vllmmlxd.api.logprob_format import FLOOR, completion_logprobs, token_entries
from vllmmlxd.api.openai.encode import ChatStreamEncoder, CompletionStreamEncoder
from vllmmlxd.engine.step.logprobs import Candidate, TokenLogprob
from vllmmlxd.engine.types import Finished, Logprobs, TextDelta, Usage

HI = TokenLogprob(5, "Hi", -0.5, (Candidate(5, "Hi", -0.5), Candidate(7, "é", -math.inf)))
THERE = TokenLogprob(9, " there", -1.25, (Candidate(9, " there", -1.25),))


def test_chat_entries_carry_bytes_and_their_top_candidates():
    [hi] = token_entries([HI])
    assert hi == {
        "token": "Hi",
        "logprob": -0.5,
        "bytes": [72, 105],
        "top_logprobs": [
            {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
            {"token": "é", "logprob": FLOOR, "bytes": [195, 169]},
        ],
    }
    assert token_entries([HI], as_ids=True)[0]["token"] == "token_id:5"


def test_completion_lists_count_text_offsets_from_where_the_text_starts():
    got = completion_logprobs([HI, THERE], offset=10)
    assert got == {
        "tokens": ["Hi", " there"],
        "token_logprobs": [-0.5, -1.25],
        "top_logprobs": [{"Hi": -0.5, "é": FLOOR}, {" there": -1.25}],
        "text_offset": [10, 12],
    }


def test_streams_attach_entries_to_the_chunk_of_their_text():
    chat = ChatStreamEncoder("r", 1, "m", False)
    frames = [
        *chat.event(Logprobs((HI, THERE))),
        *chat.event(TextDelta("Hi there")),
        *chat.event(Finished("stop", Usage(1, 2))),
    ]
    chunks = [json.loads(f[6:]) for f in frames]
    assert [c["token"] for c in chunks[0]["choices"][0]["logprobs"]["content"]] == ["Hi", " there"]
    assert chunks[1]["choices"][0]["logprobs"] is None
    text = CompletionStreamEncoder("r", 1, "m", False)
    frames = [*text.event(TextDelta("A")), *text.event(Logprobs((HI,))), *text.event(TextDelta("Hi"))]
    second = json.loads(frames[1][6:])["choices"][0]["logprobs"]
    assert second["text_offset"] == [1] and second["tokens"] == ["Hi"]
