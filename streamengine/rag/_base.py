"""What every RAG store shares: the protocols, hits, query words, rank fusion, and the ``rag_search`` tool.

What every RAG store shares: the protocols, hits, query words and rank fusion.

Kept apart from any one store so a second backend (PostgreSQL) gives the same
query meaning: the same tokens, the same fusion constant.

The built-in ``rag_search`` tool: lets the model search what earlier tools of its conversation returned.

Each run gets its own instance bound to the run's scope (its conversation,
or itself), so a search never sees what another conversation filed; the
scope is never an argument the model could change.  The instance is a copy
of one template made per engine: the schema (a pydantic model) is built
once, not per run.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    SupportsFloat,
    Tuple,
    TypeVar,
    runtime_checkable,
)

from .. import _validation as validation
from .._errors import ConfigError, ToolError
from ..tools import Tool, tool

if TYPE_CHECKING:
    from loguru import Logger

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al. 2009): 1 / (60 + rank)."""

# Letters and digits only: this is how FTS5's unicode61 tokenizer sees words
# (the underscore is punctuation to it), and using the same view for query
# tokens, the LIKE fallback and HashingEmbedder keeps the three consistent.
_TOKEN_RE = re.compile(r"[^\W_]+")
_MAX_QUERY_TOKENS = 64
# Each ranking contributes this many candidates (or 4 * k) to the fusion:
# deep enough that a hit ranked low by one list can still be lifted by the other.
_MIN_CANDIDATES = 50


# ---------------------------------------------------------------------------
# Protocols and results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One search result.  ``score``: higher is better, comparable within one search only."""

    source: str
    text: str
    score: float


class Filing(NamedTuple):
    """One result to file: its ``chunks`` under ``source`` in ``scope`` (a plain tuple of the three does too)."""

    source: str
    chunks: Sequence[str]
    scope: str = ""


@runtime_checkable
class RagStore(Protocol):
    """What the engine needs from a retrieval store; small so pgvector can implement it.

    A store may also have ``add_many(filings, embed_model=None)`` (as
    :class:`SqliteRagStore` and :class:`PostgresRagStore` do): the engine then
    files every result waiting in one call, one transaction.
    """

    def add_chunks(self, source: str, chunks: Sequence[str], embed_model: Optional[str] = None, *,
                   scope: str = "") -> int:
        """Store ``chunks`` under ``source`` in ``scope``; returns how many were stored."""
        ...

    def search(self, query: str, k: int = 5, source: Optional[str] = None, *, scope: str = "") -> List[Hit]:
        """The ``k`` best chunks of ``scope`` for ``query``, best first, optionally from one ``source``.

        Only rows filed with the same ``scope`` are seen, whatever the query:
        the engine passes each run's scope (its conversation), so one user's
        filings never answer another's search.  ``''`` is the scope of rows
        filed without one (and of rows from before scopes existed).
        """
        ...

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors; ``model=None`` means the embedder's own default."""

    def embed(self, texts: Sequence[str], model: Optional[str]) -> List[List[float]]:
        ...


# ---------------------------------------------------------------------------
# What every store checks and how it embeds
# ---------------------------------------------------------------------------


def _check_search_args(query: object, k: object, source: object, scope: object) -> None:
    if not isinstance(query, str):
        raise ConfigError(f"search query must be a str, got {type(query).__name__}")
    validation.count(k, "k (how many hits)", minimum=1)
    _check_source(source, allow_none=True)
    _check_scope(scope)


def _check_scope(scope: object) -> None:
    if not isinstance(scope, str) or "\x00" in scope:
        raise ConfigError(f"scope must be a str without NUL, such as 'conversation:42' or 'tenant:acme', "
                          f"got {scope!r}")


def _candidate_depth(k: int) -> int:
    return max(_MIN_CANDIDATES, 4 * k)


class _StoreEmbedding:
    """The embedding side every store shares: labels, unit vectors, never failing ingestion.

    Ingestion must never fail the request, so an embedding problem is logged
    and the text is stored without vectors (found by keywords only); a query
    that cannot be embedded is answered by keywords alone.
    """

    def __init__(self, embedder: Optional[Embedder], embed_model: Optional[str], log: Logger) -> None:
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise ConfigError(
                f"embedder must have embed(texts, model), got {type(embedder).__name__}; "
                "use OpenAIEmbedder(client, model) or HashingEmbedder()"
            )
        self.embedder = embedder
        self.embed_model = embed_model
        self._log = log

    def label(self, model: Optional[str] = None) -> Optional[str]:
        """The model name stored with vectors: only same-label vectors are compared."""
        if self.embedder is None:
            return None
        return model or self.embed_model or getattr(self.embedder, "model", None) or type(self.embedder).__name__

    def for_storage(self, source: str, texts: List[str],
                    embed_model: Optional[str]) -> Tuple[List[Optional[List[float]]], Optional[str]]:
        """One unit vector (or None) per text, and the label to store them under."""
        if self.embedder is None:
            return [None] * len(texts), None
        model = embed_model or self.embed_model
        try:
            vectors = _unit_vectors(self.embedder.embed(texts, model), len(texts))
        except Exception as exc:  # ingestion must never fail the request
            self._log.warning(
                "embedding {} chunk(s) of {!r} with model {!r} failed ({}: {}); stored the text without "
                "vectors, so it is found by keywords only",
                len(texts), source, self.label(model), type(exc).__name__, exc,
            )
            return [None] * len(texts), None
        return vectors, self.label(model)

    def for_query(self, query: str) -> Optional[List[float]]:
        if self.embedder is None:
            return None
        try:
            vectors = list(self.embedder.embed([query], self.embed_model))
            if len(vectors) != 1:
                raise ValueError(f"embedder returned {len(vectors)} vectors for 1 query")
            return _unit_vector(vectors[0])
        except Exception as exc:
            self._log.warning(
                "embedding the search query failed ({}: {}); ranking by keywords (BM25) only",
                type(exc).__name__, exc,
            )
            return None


def _fuse_or_keywords(keyword: Sequence[Tuple[int, float]], semantic: Optional[Sequence[Tuple[int, float]]],
                      k: int) -> List[Tuple[int, float]]:
    """The keyword ranking alone when there is no query vector, else both fused by RRF."""
    if semantic is None:
        return list(keyword[:k])
    return _reciprocal_rank_fusion([[i for i, _ in keyword], [i for i, _ in semantic]])[:k]


_Store = TypeVar("_Store", bound="_StoreBase")


class _StoreBase:
    """The steps every store takes the same way around its own SQL.

    A subclass sets ``_embedding`` (a :class:`_StoreEmbedding`) and defines
    ``_require_open`` (raises once closed) and ``close``.
    """

    _embedding: _StoreEmbedding

    def _require_open(self) -> object:  # pragma: no cover - every store defines its own
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - every store defines its own
        raise NotImplementedError

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add_chunks(self, source: str, chunks: Sequence[str], embed_model: Optional[str] = None, *,
                   scope: str = "") -> int:
        """Store the non-blank ``chunks`` under ``source`` in ``scope``, in one transaction; how many were stored.

        Embedding failures never raise: they are logged and the text is
        stored without vectors.  Database errors raise StreamEngineError.
        """
        return self.add_many([Filing(source, chunks, scope)], embed_model)[0]

    def add_many(self, filings: Sequence[Filing], embed_model: Optional[str] = None) -> List[int]:
        """Store every filing (``(source, chunks, scope)``) in one transaction, all or none; chunks stored per filing.

        One transaction and one embedding call for many results: what lets the
        engine's filing keep up with hundreds of runs at once.  Errors as for
        :meth:`add_chunks`.
        """
        rows, vectors, label, counts = self._prepared(filings, embed_model)
        if rows:
            what = (f"{len(rows)} chunk(s) of {rows[0][0]!r}" if len(counts) == 1
                    else f"{len(rows)} chunk(s) of {len(counts)} results")
            self._insert(rows, vectors, label, what)
        return counts

    def _insert(self, rows: List[Tuple[str, str, str]], vectors: List[Optional[List[float]]],
                label: Optional[str], what: str) -> None:  # pragma: no cover - every store defines its own
        """Insert ``(source, text, scope)`` rows and their vectors in one transaction; ``what`` names them in errors."""
        raise NotImplementedError

    def _prepared(self, filings: Sequence[Filing], embed_model: Optional[str],
                  ) -> Tuple[List[Tuple[str, str, str]], List[Optional[List[float]]], Optional[str], List[int]]:
        """The ``(source, text, scope)`` rows of every non-blank chunk, their unit vectors (or None), the
        vectors' label, and how many rows each filing gave; everything is checked before anything is stored."""
        rows: List[Tuple[str, str, str]] = []
        counts: List[int] = []
        for filing in filings:
            source, chunks, scope = Filing(*filing)  # a plain (source, chunks) or (source, chunks, scope) too
            _check_source(source, allow_none=False)
            _check_scope(scope)
            texts = _clean_chunks(chunks)
            rows += [(source, text, scope) for text in texts]
            counts.append(len(texts))
        if not rows:
            return [], [], None, counts
        self._require_open()  # before a possibly slow embedding call
        about = rows[0][0] if len(counts) == 1 else f"{len(counts)} results"
        vectors, label = self._embedding.for_storage(about, [text for _, text, _ in rows], embed_model)
        return rows, vectors, label, counts

    def _checked_query(self, query: str, k: int, source: Optional[str],
                       scope: str) -> Tuple[bool, Optional[List[float]]]:
        """Whether there is anything to search for, and the query's unit vector (None: keywords only)."""
        _check_search_args(query, k, source, scope)
        if not query.strip():
            return False, None
        self._require_open()  # before a possibly slow query embedding
        return True, self._embedding.for_query(query)


def _hits_in_order(ranked: Sequence[Tuple[int, float]], rows: Iterable[Tuple[int, str, str]]) -> List[Hit]:
    """Hits for the ranked ids, in rank order, from ``(id, source, text)`` rows in any order."""
    by_id = {row_id: (source, text) for row_id, source, text in rows}
    return [Hit(by_id[i][0], by_id[i][1], score) for i, score in ranked if i in by_id]


def _check_source(source: object, allow_none: bool) -> None:
    if source is None and allow_none:
        return
    if not isinstance(source, str) or not source:
        raise ConfigError(f"source must be a non-empty str such as 'tool:fetch:call_1', got {source!r}")


def _clean_chunks(chunks: Iterable[object]) -> List[str]:
    if isinstance(chunks, str):
        raise ConfigError("chunks must be a list of str, not one str; pass [text] or chunks_for_ingest(text)")
    texts: List[str] = []
    for item in chunks:
        if not isinstance(item, str):
            raise ConfigError(f"every chunk must be a str, got {type(item).__name__}")
        texts.append(item)
    # NUL cannot be stored in PostgreSQL text and cuts SQLite's LIKE short:
    # every store keeps U+FFFD in its place, so all find the words around it.
    return [text.replace("\x00", "\ufffd") for text in texts if text.strip()]


def _query_tokens(query: str) -> List[str]:
    """Distinct lower-case words of the query, in order, at most 64."""
    tokens: List[str] = []
    for token in _TOKEN_RE.findall(query.lower()):
        if token not in tokens:
            tokens.append(token)
            if len(tokens) == _MAX_QUERY_TOKENS:
                break
    return tokens


def _unit_vector(values: Iterable[SupportsFloat]) -> Optional[List[float]]:
    """The vector scaled to length 1; None when empty, zero or not finite."""
    vector = [float(x) for x in values]
    norm = math.sqrt(sum(x * x for x in vector))
    if not vector or not math.isfinite(norm) or norm == 0.0:
        return None
    return [x / norm for x in vector]


def _unit_vectors(vectors: Iterable[Iterable[SupportsFloat]], expected: int) -> List[Optional[List[float]]]:
    """Each vector scaled to unit length (None when unusable); ValueError on a malformed answer."""
    listed = list(vectors)
    if len(listed) != expected:
        raise ValueError(f"embedder returned {len(listed)} vectors for {expected} texts")
    return [_unit_vector(vector) for vector in listed]


def _reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> List[Tuple[int, float]]:
    """Fuse rankings of ids: each id scores the sum of 1 / (k + rank) over the rankings."""
    scores: Dict[int, float] = {}
    for ranking in rankings:
        for rank, row_id in enumerate(ranking, start=1):
            scores[row_id] = scores.get(row_id, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def _searcher(store: RagStore, scope: Optional[str]) -> Callable[[str, int], str]:
    def rag_search(query: str, k: int = 5) -> str:
        """Search the text that earlier tool calls in this conversation returned (only this conversation's).

        Use it to find a detail in a long tool result instead of calling the tool again.
        """
        if scope is None:
            raise ToolError("rag_search runs only inside an engine run: it searches that run's conversation")
        hits = store.search(query, k=max(1, min(int(k), 20)), scope=scope)
        if not hits:
            return f"no stored text matches {query!r}"
        return "\n\n".join(f"[{n}] ({hit.source}) {hit.text}" for n, hit in enumerate(hits, 1))

    return rag_search


def make_rag_search_tool(store: RagStore, scope: Optional[str]) -> Tool:
    """A tool bound to ``store`` and ``scope``.

    ``scope=None`` gives the engine's registered template (its spec is what
    the model sees); called outside a run it refuses, since it would not
    know whose text to search.
    """
    made: Tool = tool(name="rag_search")(_searcher(store, scope))
    return made


def bound_to_scope(template: Tool, store: RagStore, scope: str) -> Tool:
    """``template`` (from :func:`make_rag_search_tool`) searching ``scope``: same schema, no rebuild.

    The function has the template's signature, so the checked arguments the
    template's schema produces fit it.
    """
    bound = copy.copy(template)
    object.__setattr__(bound, "fn", _searcher(store, scope))  # Tool refuses plain assignment
    return bound
