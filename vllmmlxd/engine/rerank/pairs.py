"""Query-document pairs fitted to a reranker's limit: pure functions over token ids.

Only the document is ever cut, at its end: the query is what every pair is judged against,
and a retrieval chunk's start is where its topic is. A request that says ``truncate: false``
gets a 400 instead, naming the document.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ContextLengthExceeded
from .rerank_types import Pair


def document_room(query_tokens: int, fixed_tokens: int, limit: int) -> int:
    """How many document tokens fit beside the query and the model's own tokens; a query that
    leaves no room for one is refused (cutting the query would score against another question)."""
    room = limit - query_tokens - fixed_tokens
    if room < 1:
        raise ContextLengthExceeded(
            f"query is {query_tokens} tokens; with the model's {fixed_tokens} own tokens it leaves no room "
            f"for a document within this model's {limit}-token limit",
            param="query",
        )
    return room


def fit_document(doc: Sequence[int], room: int, *, truncate: bool, index: int) -> tuple[list[int], bool]:
    """The document's tokens within ``room`` (its start kept) and whether it was cut; refused when
    it is too long and ``truncate`` is off."""
    if len(doc) <= room:
        return list(doc), False
    if not truncate:
        raise ContextLengthExceeded(
            f"documents[{index}] does not fit beside this query in the model's limit ({len(doc)} tokens "
            f"where {room} fit); send truncate: true (the default) to cut long documents to fit",
            param="documents",
        )
    return list(doc[:room]), True


def bert_pair(query: Sequence[int], doc: Sequence[int], cls: int, sep: int, truncated: bool = False) -> Pair:
    """BERT's pair input: ``[CLS] query [SEP] document [SEP]``, segment 0 up to the first [SEP], 1 after."""
    ids = (cls, *query, sep, *doc, sep)
    first = len(query) + 2
    return Pair(ids=ids, types=(0,) * first + (1,) * (len(ids) - first), truncated=truncated)


def bert_pairs(
    query: Sequence[int], docs: Sequence[Sequence[int]], *, cls: int, sep: int, limit: int, truncate: bool
) -> list[Pair]:
    """A cross-encoder's pairs of one query and its documents, each within ``limit`` tokens."""
    room = document_room(len(query), 3, limit)  # [CLS], [SEP], [SEP]
    pairs = []
    for i, doc in enumerate(docs):
        kept, cut = fit_document(doc, room, truncate=truncate, index=i)
        pairs.append(bert_pair(query, kept, cls, sep, cut))
    return pairs


def prompt_pairs(
    prefix: Sequence[int],
    bodies: Sequence[Sequence[int]],
    suffix: Sequence[int],
    *,
    query_tokens: int,
    limit: int,
    truncate: bool,
) -> list[Pair]:
    """An LLM reranker's pairs: ``prefix`` (its prompt's start), each body (the query and one
    document as one text, the document last), then ``suffix`` (up to where the answer goes).
    A body is cut at its end, so only its document loses tokens; ``query_tokens``: the body's
    length without a document, which must fit whatever is cut."""
    fixed = len(prefix) + len(suffix)
    document_room(query_tokens, fixed, limit)
    room = limit - fixed
    pairs = []
    for i, body in enumerate(bodies):
        kept, cut = fit_document(body, room, truncate=truncate, index=i)
        pairs.append(Pair(ids=(*prefix, *kept, *suffix), truncated=cut))
    return pairs
