"""BERT cross-encoders (``BertForSequenceClassification`` folders) in MLX: bert.py's encoder
with BERT's pooler (tanh of a dense layer over [CLS]) and the classifier head.

A pair is ``[CLS] query [SEP] document [SEP]`` with segment ids 0 then 1, as BERT was trained
on pairs; padded rows are masked out, so a batch gives each pair the score it gets alone. The
score is the single logit through a sigmoid: what sentence-transformers' CrossEncoder applies
to a one-label model (its docs: "If 1, ... outputs a continuous score 0...1") and vLLM's score
and rerank routes do; a folder whose config names the identity activation gets the raw logit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...errors import ModelLoadError
from ..embeddings.bert import BertConfig, BertEncoder, Pooling, read_weights
from ..embeddings.embedder import load_tokenizer, max_tokens_of
from .pairs import bert_pairs
from .rerank_types import Pair

# A cross-encoder's checkpoint holds the pooler and the classifier; only a masked-LM head goes unused.
_UNUSED = ("cls.", "embeddings.position_ids")
MAX_BATCH_ROWS = 32
MAX_BATCH_TOKENS = 4096  # rows x padded length of one forward pass at most


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def activation_of(config: dict, st_config: dict) -> str:
    """``sigmoid`` or ``identity``: what turns the logit into the score. sentence-transformers writes a
    cross-encoder's activation to config.json (older) or config_sentence_transformers.json (newer);
    unnamed, a one-label model gets the sigmoid."""
    named = st_config.get("activation_fn") or config.get("sbert_ce_default_activation_function") or ""
    return "identity" if str(named).endswith("Identity") else "sigmoid"


def num_labels_of(config: dict) -> int:
    """The classifier's outputs: ``id2label``'s size, else ``num_labels``, else 1."""
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    value = config.get("num_labels", 1)
    return value if isinstance(value, int) else 1


def special_ids(tokenizer: Any, folder: Path) -> tuple[int, int]:
    """The ids of the tokenizer's [CLS] and [SEP] (as special_tokens_map.json names them)."""
    names = _read_json(folder / "special_tokens_map.json")

    def token(key: str, default: str) -> str:
        value = names.get(key, default)
        return str(value.get("content", default)) if isinstance(value, dict) else str(value)

    cls, sep = (tokenizer.token_to_id(token(k, d)) for k, d in (("cls_token", "[CLS]"), ("sep_token", "[SEP]")))
    if cls is None or sep is None:
        raise ModelLoadError(f"the tokenizer of {folder} has no [CLS] or [SEP] token: not a BERT cross-encoder")
    return cls, sep


class _Pooler(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)


class BertCrossEncoder(BertEncoder):
    """A BERT with its pooler and a one-logit classifier: pairs in, logits out."""

    def __init__(self, config: BertConfig, num_labels: int = 1):
        super().__init__(config, Pooling("cls", normalize=False))
        self.pooler = _Pooler(config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def logits(self, ids: mx.array, lengths: mx.array, types: mx.array) -> mx.array:
        """``(batch, num_labels)`` logits of padded pairs (``lengths``: each row's real length)."""
        x, _ = self.hidden(ids, lengths, types)
        return self.classifier(mx.tanh(self.pooler.dense(x[:, 0])))


class CrossEncoderScorer:
    """Pairs and forward passes of a BERT cross-encoder folder (the reranker's thread runs them)."""

    kind = "cross-encoder"
    max_rows, max_tokens = MAX_BATCH_ROWS, MAX_BATCH_TOKENS

    def __init__(self, folder: Path):
        config = _read_json(folder / "config.json")
        labels = num_labels_of(config)
        if labels != 1:
            raise ModelLoadError(
                f"{folder} classifies into {labels} labels; only one-label cross-encoders (a relevance score) rerank"
            )
        self.folder = folder
        self.model = BertCrossEncoder(BertConfig.from_dict(config))
        self.model.load_weights(list(read_weights(folder, _UNUSED).items()), strict=True)
        mx.eval(self.model.parameters())
        self.tokenizer = load_tokenizer(folder)
        self.cls, self.sep = special_ids(self.tokenizer, folder)
        self.activation = activation_of(config, _read_json(folder / "config_sentence_transformers.json"))
        self.limit = max_tokens_of(folder, self.model.config.max_position_embeddings)

    def make_pairs(self, query: str, documents: Sequence[str], *, truncate: bool) -> list[Pair]:
        q = self.tokenizer.encode(query, add_special_tokens=False).ids
        docs = [e.ids for e in self.tokenizer.encode_batch(list(documents), add_special_tokens=False)]
        return bert_pairs(q, docs, cls=self.cls, sep=self.sep, limit=self.limit, truncate=truncate)

    def run_batch(self, pairs: list[Pair]) -> np.ndarray:
        """One forward pass over ``pairs``, padded to the longest: one score each."""
        width = max(len(p) for p in pairs)
        ids = np.zeros((len(pairs), width), dtype=np.int32)
        types = np.zeros((len(pairs), width), dtype=np.int32)
        for row, pair in enumerate(pairs):
            ids[row, : len(pair)] = pair.ids
            types[row, : len(pair)] = pair.types or ()
        lengths = mx.array([len(p) for p in pairs], dtype=mx.int32)
        logit = self.model.logits(mx.array(ids), lengths, mx.array(types))[:, 0]
        score = mx.sigmoid(logit) if self.activation == "sigmoid" else logit
        return np.array(score.astype(mx.float32))
