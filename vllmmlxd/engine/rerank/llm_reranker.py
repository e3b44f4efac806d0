"""LLM rerankers of the Qwen3-Reranker kind: a causal LM asked whether a document meets a
query, scored by its next-token logits for "yes" and "no" after its prompt.

The prompt is the model card's (the form the model was trained to answer): a system turn
that asks for "yes" or "no", a user turn of instruction, query and document, and an empty
thinking block opening the answer. The score is the softmax of the two logits at the last
position, taken at "yes". Prefix and suffix are tokenized alone and the user text as one, as
the card's reference code does, so a pair's tokens are the reference's.

Batches are padded on the right and no mask is needed: under the causal mask a position never
sees what comes after it, so each row's last real position reads only its own tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from ...errors import ModelLoadError
from ..loading.loader import LoadedModel
from .pairs import prompt_pairs
from .rerank_types import Pair

PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
MAX_PAIR_TOKENS = 8192  # the card's max_length; longer windows cost memory no reranking needs
MAX_BATCH_ROWS = 16
MAX_BATCH_TOKENS = 4096
# Families whose logits are the head over the last norm's output, nothing after: only the
# rows' last positions go through the head (a 150k-token vocabulary at every position would not).
PLAIN_HEADS = frozenset({"qwen3", "qwen2", "llama", "mistral"})


def user_text(query: str, document: str, instruction: str = INSTRUCTION) -> str:
    """The user turn of one pair, the document last (so cutting the text's end cuts the document)."""
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def answer_ids(tokenizer: Any) -> tuple[int, int]:
    """The token ids of "yes" and "no" (each must be one token of the vocabulary)."""
    ids = []
    for word in ("yes", "no"):
        value = tokenizer.convert_tokens_to_ids(word)
        if not isinstance(value, int) or value == getattr(tokenizer, "unk_token_id", None):
            raise ModelLoadError(f'the tokenizer has no single "{word}" token: not a yes/no LLM reranker')
        ids.append(value)
    return ids[0], ids[1]


def yes_probability(logits: mx.array, yes: int, no: int) -> mx.array:
    """softmax over the (no, yes) logits of each row, at yes."""
    pair = mx.stack([logits[:, no], logits[:, yes]], axis=1).astype(mx.float32)
    return mx.exp(pair[:, 1] - mx.logsumexp(pair, axis=1))


class LLMScorer:
    """Pairs and forward passes of a causal LM served as a reranker (the reranker's thread runs them)."""

    kind = "llm"
    activation = "yes-no softmax"
    max_rows, max_tokens = MAX_BATCH_ROWS, MAX_BATCH_TOKENS

    def __init__(self, loaded: LoadedModel, model_type: str | None):
        if loaded.vision is not None:
            raise ModelLoadError(f"{loaded.name} is a vision model; an LLM reranker is a text model")
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.folder = loaded.path
        self.yes, self.no = answer_ids(loaded.tokenizer)
        self.limit = min(loaded.context_length, MAX_PAIR_TOKENS)
        self.plain_head = model_type in PLAIN_HEADS
        # transformers' fast tokenizers reset their truncation state on each call: concurrent
        # calls from two requests' threads can fail ("Already borrowed"), so one at a time.
        self._tokenizing = threading.Lock()
        self.prefix = self._encode(PREFIX)
        self.suffix = self._encode(SUFFIX)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def make_pairs(self, query: str, documents: Sequence[str], *, truncate: bool) -> list[Pair]:
        with self._tokenizing:
            bodies = [self._encode(user_text(query, d)) for d in documents]
            query_tokens = len(self._encode(user_text(query, "")))
        return prompt_pairs(
            self.prefix, bodies, self.suffix, query_tokens=query_tokens, limit=self.limit, truncate=truncate
        )

    def last_logits(self, ids: mx.array, lengths: mx.array) -> mx.array:
        """``(batch, vocab)``: each row's logits at its last real position."""
        rows = mx.arange(ids.shape[0])
        inner = getattr(self.model, "model", None)
        if not self.plain_head or inner is None:
            return self.model(ids)[rows, lengths - 1]
        hidden = inner(ids)[rows, lengths - 1]
        head = getattr(self.model, "lm_head", None)
        return head(hidden) if head is not None else inner.embed_tokens.as_linear(hidden)

    def run_batch(self, pairs: list[Pair]) -> np.ndarray:
        """One forward pass over ``pairs``, padded on the right to the longest: one score each."""
        width = max(len(p) for p in pairs)
        ids = np.zeros((len(pairs), width), dtype=np.int32)
        for row, pair in enumerate(pairs):
            ids[row, : len(pair)] = pair.ids
        lengths = mx.array([len(p) for p in pairs], dtype=mx.int32)
        logits = self.last_logits(mx.array(ids), lengths)
        return np.array(yes_probability(logits, self.yes, self.no))
