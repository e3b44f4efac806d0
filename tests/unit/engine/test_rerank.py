"""Rerankers in-process: pairs and their limits (pure), builtin:tiny-reranker against an
independent numpy forward (tests/support/rerank_reference.py), and an LLM reranker on a
random-weight Qwen3 folder against mlx-lm's own forward of the same prompt. Random weights:
two paths must agree; nothing here judges relevance."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load as mlx_lm_load

from tests.support.families import save
from tests.support.rerank_reference import ReferenceCrossEncoder
from vllmmlxd.engine.embeddings.bert import is_sequence_classifier
from vllmmlxd.engine.embeddings.embedder import is_embedding_spec
from vllmmlxd.engine.loading import builtin
from vllmmlxd.engine.rerank.cross_encoder import activation_of, num_labels_of
from vllmmlxd.engine.rerank.llm_reranker import PREFIX, SUFFIX, user_text
from vllmmlxd.engine.rerank.pairs import bert_pair, bert_pairs, document_room, fit_document, prompt_pairs
from vllmmlxd.engine.rerank.reranker import is_rerank_spec, load_reranker
from vllmmlxd.errors import ContextLengthExceeded

QUERY = "what do cats eat?"
DOCS = [
    "Cats are carnivores and eat meat.",
    "The stock market fell sharply on Tuesday.",
    "A kitten needs food several times a day, mostly fish or chicken.",
    "",
    "word " * 200,
]


# -- pairs: pure ---------------------------------------------------------------


def test_a_bert_pair_is_cls_query_sep_document_sep_with_two_segments():
    pair = bert_pair([5, 6], [7, 8, 9], cls=1, sep=2)
    assert pair.ids == (1, 5, 6, 2, 7, 8, 9, 2)
    assert pair.types == (0, 0, 0, 0, 1, 1, 1, 1)


def test_only_the_document_is_cut_and_only_when_allowed():
    pairs = bert_pairs([5, 6], [[7] * 3, [8] * 10], cls=1, sep=2, limit=10, truncate=True)
    assert [len(p) for p in pairs] == [8, 10]
    assert pairs[1].ids == (1, 5, 6, 2, 8, 8, 8, 8, 8, 2) and pairs[1].truncated and not pairs[0].truncated
    with pytest.raises(ContextLengthExceeded) as err:
        bert_pairs([5, 6], [[7] * 3, [8] * 10], cls=1, sep=2, limit=10, truncate=False)
    assert "documents[1]" in err.value.message and err.value.param == "documents"


def test_a_query_that_leaves_no_room_is_refused_even_when_truncating():
    assert document_room(5, 3, 9) == 1
    with pytest.raises(ContextLengthExceeded) as err:
        document_room(6, 3, 9)
    assert err.value.param == "query"
    assert fit_document([1, 2, 3], 5, truncate=False, index=0) == ([1, 2, 3], False)


def test_prompt_pairs_cut_the_body_end_between_prefix_and_suffix():
    pairs = prompt_pairs([1, 1], [[3, 4, 5], [3, 4, 5, 6, 7, 8]], [9], query_tokens=2, limit=7, truncate=True)
    assert [p.ids for p in pairs] == [(1, 1, 3, 4, 5, 9), (1, 1, 3, 4, 5, 6, 9)]
    assert pairs[1].truncated and pairs[0].types is None
    with pytest.raises(ContextLengthExceeded):
        prompt_pairs([1, 1], [[3]], [9], query_tokens=5, limit=7, truncate=True)


def test_the_activation_and_labels_come_from_the_folders_config():
    assert activation_of({}, {}) == "sigmoid"
    assert activation_of({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, {}) == "identity"
    assert activation_of({}, {"activation_fn": "torch.nn.modules.activation.Sigmoid"}) == "sigmoid"
    assert num_labels_of({"id2label": {"0": "LABEL_0"}}) == 1 and num_labels_of({"num_labels": 3}) == 3


# -- builtin:tiny-reranker -------------------------------------------------------


@pytest.fixture(scope="module")
def folder(state_dir):
    return builtin.ensure_builtin("tiny-reranker", state_dir)


@pytest.fixture(scope="module")
def reranker(state_dir):
    r = load_reranker("builtin:tiny-reranker", state_dir)
    yield r
    r.close()


def test_the_builtin_is_a_cross_encoder_and_not_an_embedding_model(folder):
    assert is_sequence_classifier(folder)
    assert is_rerank_spec("builtin:tiny-reranker") and is_rerank_spec(str(folder))
    assert not is_embedding_spec("builtin:tiny-reranker") and not is_embedding_spec(str(folder))
    assert is_rerank_spec("org/any-model", "rerank") and not is_rerank_spec("builtin:tiny")


def test_pairs_are_the_tokenizers_own_pair_encoding(folder, reranker):
    reference = ReferenceCrossEncoder(folder)
    pairs = reranker.make_pairs(QUERY, DOCS[:4], truncate=True)
    for pair, doc in zip(pairs, DOCS[:4]):
        assert (list(pair.ids), list(pair.types or ())) == reference.pair(QUERY, doc)
    assert reranker.info.max_tokens == 128


def test_scores_equal_the_numpy_reference_within_1e_4(folder, reranker):
    reference = ReferenceCrossEncoder(folder)
    pairs = reranker.make_pairs(QUERY, DOCS, truncate=True)
    got = asyncio.run(reranker.score(pairs))
    want = [reference.score(QUERY, d, max_tokens=128) for d in DOCS]
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert pairs[4].truncated and len(pairs[4]) == 128
    assert np.ptp(got) > 0.05  # spread scores: a wrong pairing could not pass unseen


def test_a_padded_batch_scores_each_pair_as_alone(reranker):
    pairs = reranker.make_pairs(QUERY, [f"document {i} " + "about cats " * (i % 7) for i in range(40)], truncate=True)
    before = reranker.stats.batches
    together = asyncio.run(reranker.score(pairs))
    assert 2 <= reranker.stats.batches - before <= 4  # 40 pairs: sorted by length, a few passes
    alone = np.array([asyncio.run(reranker.score([p]))[0] for p in pairs[::7]])
    np.testing.assert_allclose(together[::7], alone, atol=1e-5)
    assert reranker.describe()["kind"] == "cross-encoder" and reranker.describe()["score"] == "sigmoid"


# -- an LLM reranker (Qwen3-Reranker's prompt) on a random-weight Qwen3 --------


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, state_dir):
    return save(
        "qwen3",
        "float32",
        tmp_path_factory.mktemp("qr") / "qwen3",
        tokenizer_from=builtin.ensure_builtin("tiny", state_dir),
    )


def test_an_llm_reranker_scores_as_mlx_lm_forward_of_its_prompt(qwen3, state_dir):
    reranker = load_reranker(str(qwen3), state_dir)
    try:
        assert reranker.info.kind == "llm" and reranker.info.score == "yes-no softmax"
        docs = DOCS[:3]
        got = asyncio.run(reranker.score(reranker.make_pairs(QUERY, docs, truncate=True)))
    finally:
        reranker.close()
    model, tokenizer = mlx_lm_load(str(qwen3))[:2]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    want = []
    for doc in docs:
        ids = [*tokenizer.encode(PREFIX, add_special_tokens=False)]
        ids += tokenizer.encode(user_text(QUERY, doc), add_special_tokens=False)
        ids += tokenizer.encode(SUFFIX, add_special_tokens=False)
        last = model(mx.array([ids]))[0, -1]
        both = np.array([last[no].item(), last[yes].item()], dtype=np.float64)
        want.append(np.exp(both[1] - np.logaddexp(both[0], both[1])))
    np.testing.assert_allclose(got, want, atol=1e-4)
    # Random weights put every score near 0: their logs too must agree, and differ between documents.
    np.testing.assert_allclose(np.log(got), np.log(want), atol=1e-4)
    assert np.ptp(np.log(want)) > 0.1
