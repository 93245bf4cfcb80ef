"""Retrieval store: what the tools fetched becomes searchable in the same request.

The engine ingests every successful tool result (``chunks_for_ingest`` then
``RagStore.add_chunks``) so that a later ``rag_search`` -- in the same
continuation round or a later one -- finds it.  This module holds:

- :func:`chunks_for_ingest`: deterministic splitting on paragraph, then
  sentence, then word boundaries, with an overlap of whole words;
- :class:`RagStore`: the small protocol the engine talks to (three methods, so
  a PostgreSQL + pgvector store can implement it later);
- :class:`SqliteRagStore`: the embedded default: SQLite + FTS5 (BM25) always,
  cosine similarity fused with BM25 by reciprocal rank fusion when an
  embedder is given;
- :class:`Embedder` with :class:`OpenAIEmbedder` (a provider's
  ``/v1/embeddings`` through any client with ``embed(texts, model)``) and
  :class:`HashingEmbedder` (deterministic, local, for tests and offline use).

Layering: this module depends only on ``errors``/``logs`` and the standard
library.  It never imports the clients; ``OpenAIEmbedder`` duck-types
``client.embed``.

Ingestion must never fail the request, so embedding problems are logged and
the text is stored without vectors (it is then found by keywords only).
"""
from __future__ import annotations

import hashlib
import heapq
import math
import operator
import os
import re
import sqlite3
import sys
import threading
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from typing import Protocol, runtime_checkable

from .errors import ConfigError, LlmProtocolError, StreamEngineError
from .logs import component_logger

__all__ = [
    "Embedder", "HashingEmbedder", "Hit", "OpenAIEmbedder", "RagStore", "SqliteRagStore",
    "chunks_for_ingest",
]

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
# Chunking
# ---------------------------------------------------------------------------

_WORD_RE = re.compile(r"\S+")
# A word ending in . ! ? or an ellipsis, maybe followed by closing quotes or
# brackets, ends a sentence.  Crude on purpose ("e.g." ends one too): it only
# chooses where a chunk may end, and determinism matters more than linguistics.
_SENTENCE_END_RE = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*$")
_WORD_BREAK, _SENTENCE_BREAK, _PARAGRAPH_BREAK = 1, 2, 3

_Span = Tuple[int, int]


def chunks_for_ingest(text: str, chunk_size: int = 800, overlap: int = 100) -> List[str]:
    """Split ``text`` into chunks of at most ``chunk_size`` characters for retrieval.

    Boundaries are chosen in order of preference: paragraphs (a blank line),
    then sentences (a word ending in ``.``, ``!``, ``?`` -- a single line
    break counts as a sentence end too, which suits lists, logs and tables),
    then words.  Small paragraphs are packed together; a paragraph too big for
    one chunk is split on its own, so its pieces never share a chunk with a
    neighbouring paragraph.

    Each chunk after the first starts with up to ``overlap`` characters of
    whole words from the end of the previous chunk (fewer when the next
    piece would not fit otherwise), so a phrase cut by a boundary is still
    found whole.  A word is never cut: a single word longer than
    ``chunk_size`` (a URL, a base64 blob) becomes a chunk of its own, longer
    than ``chunk_size``, with no overlap.

    Every chunk is a verbatim slice of ``text`` (inner whitespace kept), so a
    hit can be found again in its source.  The result is deterministic;
    empty or whitespace-only text gives ``[]``.
    """
    _check_chunk_args(text, chunk_size, overlap)
    return [text[start:end] for start, end in _chunk_spans(text, chunk_size, overlap)]


def _check_chunk_args(text: Any, chunk_size: Any, overlap: Any) -> None:
    if not isinstance(text, str):
        raise ConfigError(f"chunks_for_ingest needs text as str, got {type(text).__name__}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ConfigError(f"chunk_size must be a positive int (characters), got {chunk_size!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < chunk_size:
        raise ConfigError(
            f"overlap must be an int with 0 <= overlap < chunk_size ({chunk_size}), got {overlap!r}"
        )


def _chunk_spans(text: str, size: int, overlap: int) -> List[_Span]:
    """Character spans ``(start, end)`` of each chunk, overlap included."""
    words = [m.span() for m in _WORD_RE.finditer(text)]
    if not words:
        return []
    if words[-1][1] - words[0][0] <= size:
        return [(words[0][0], words[-1][1])]
    breaks = _break_strengths(text, words)
    groups: List[List[_Span]] = []
    _split(words, breaks, 0, len(words), size, groups)
    return [(words[first][0], words[end - 1][1]) for first, end in _pack(words, groups, size, overlap)]


def _break_strengths(text: str, words: Sequence[_Span]) -> List[int]:
    """``strengths[i]``: how good a place the gap before word ``i`` is to end a chunk."""
    strengths = [0]
    for i in range(1, len(words)):
        newlines = text.count("\n", words[i - 1][1], words[i][0])
        if newlines >= 2:
            strengths.append(_PARAGRAPH_BREAK)
        elif newlines == 1 or _SENTENCE_END_RE.search(text, words[i - 1][0], words[i - 1][1]):
            strengths.append(_SENTENCE_BREAK)
        else:
            strengths.append(_WORD_BREAK)
    return strengths


def _split(words: Sequence[_Span], breaks: Sequence[int], i: int, j: int, size: int,
           groups: List[List[_Span]]) -> None:
    """Cut words[i:j] (too big for one chunk) at its strongest breaks.

    Appends groups of units (word-index ranges); units of one group may be
    packed into one chunk, a new group always starts a new chunk.  A part
    still too big is cut again at the next weaker breaks, in a group of its
    own: that is what keeps a big paragraph's pieces apart from its
    neighbours.  Depth is bounded by the three break strengths.
    """
    level = max(breaks[i + 1:j])
    cuts = [i] + [m for m in range(i + 1, j) if breaks[m] == level] + [j]
    group: List[_Span] = []
    for a, b in zip(cuts, cuts[1:]):
        if b - a == 1 or words[b - 1][1] - words[a][0] <= size:
            group.append((a, b))
            continue
        if group:
            groups.append(group)
            group = []
        _split(words, breaks, a, b, size, groups)
    if group:
        groups.append(group)


def _pack(words: Sequence[_Span], groups: Sequence[Sequence[_Span]], size: int,
          overlap: int) -> List[_Span]:
    """Greedily pack units into chunks; returns word-index ranges ``(first, end)``."""
    chunks: List[_Span] = []
    for group in groups:
        current: Optional[_Span] = None
        for a, b in group:
            if current is not None and words[b - 1][1] - words[current[0]][0] <= size:
                current = (current[0], b)
                continue
            if current is not None:
                chunks.append(current)
            previous = chunks[-1] if chunks else None
            current = (_overlap_start(words, previous, a, b, size, overlap), b)
        if current is not None:
            chunks.append(current)
    return chunks


def _overlap_start(words: Sequence[_Span], previous: Optional[_Span], a: int, b: int,
                   size: int, overlap: int) -> int:
    """First word of a chunk whose new text is words[a:b]: reach back into ``previous``.

    Takes as many of the previous chunk's last words as stay within
    ``overlap`` characters and keep the chunk within ``size``.
    """
    if previous is None or overlap == 0:
        return a
    first, end = previous
    tail_end, chunk_end = words[end - 1][1], words[b - 1][1]
    start = a
    for w in range(end - 1, first - 1, -1):
        word_start = words[w][0]
        if tail_end - word_start > overlap or chunk_end - word_start > size:
            break
        start = w
    return start


# ---------------------------------------------------------------------------
# Protocols and results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One search result.  ``score``: higher is better, comparable within one search only."""

    source: str
    text: str
    score: float


@runtime_checkable
class RagStore(Protocol):
    """What the engine needs from a retrieval store; small so pgvector can implement it."""

    def add_chunks(self, source: str, chunks: Sequence[str], embed_model: Optional[str] = None) -> int:
        """Store ``chunks`` under ``source``; returns how many were stored."""
        ...

    def search(self, query: str, k: int = 5, source: Optional[str] = None) -> List[Hit]:
        """The ``k`` best chunks for ``query``, best first, optionally from one ``source``."""
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
# Embedders
# ---------------------------------------------------------------------------


class OpenAIEmbedder:
    """Embeds through a provider's ``/v1/embeddings`` via ``client.embed(texts, model)``.

    Requests are batched (``batch_size`` texts each) because providers cap
    the inputs of one request.  Any client error propagates: the store
    decides what a failure means (it logs and keeps the text).
    """

    def __init__(self, client: Any, model: str, batch_size: int = 64) -> None:
        if not callable(getattr(client, "embed", None)):
            raise ConfigError(
                f"OpenAIEmbedder needs a client with embed(texts, model), got {type(client).__name__}; "
                "pass an OpenAICompatibleClient"
            )
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"OpenAIEmbedder needs an embedding model name, got {model!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.client = client
        self.model = model
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str], model: Optional[str] = None) -> List[List[float]]:
        """One vector per text, in order; ``model`` overrides the default for this call."""
        texts = list(texts)
        use = model or self.model
        vectors: List[List[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start:start + self.batch_size]
            got = self.client.embed(batch, use)
            if len(got) != len(batch):
                raise LlmProtocolError(
                    f"embedding model {use!r} returned {len(got)} vectors for {len(batch)} inputs; "
                    "the provider's /embeddings answer is incomplete"
                )
            vectors.extend([float(x) for x in vector] for vector in got)
        return vectors


class HashingEmbedder:
    """A deterministic local embedder: a bag of hashed words, L2-normalised.

    Each lower-cased word is hashed (BLAKE2b, so it is stable across
    processes, unlike ``hash()``) to one of ``dim`` buckets with a +1/-1 sign
    (feature hashing).  It knows no synonyms -- texts are similar when they
    share words -- but it needs no network, which makes it right for tests
    and offline use.  A text without words gives the zero vector.
    """

    def __init__(self, dim: int = 64) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ConfigError(f"HashingEmbedder dim must be a positive int, got {dim!r}")
        self.dim = dim
        self.model = f"hashing-{dim}"

    def embed(self, texts: Sequence[str], model: Optional[str] = None) -> List[List[float]]:
        """One unit vector per text; ``model`` is accepted for the protocol and ignored."""
        return [self._embed_one(text) for text in texts]

    def _embed_one(self, text: str) -> List[float]:
        vector = [0.0] * self.dim
        for word in _TOKEN_RE.findall(text.lower()):
            value = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
            vector[value % self.dim] += -1.0 if value >> 63 else 1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector] if norm else vector


# ---------------------------------------------------------------------------
# SQLite store
# ---------------------------------------------------------------------------

_SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, source TEXT NOT NULL, "
    "text TEXT NOT NULL, embed_model TEXT, vector BLOB)",
    "CREATE INDEX IF NOT EXISTS chunks_by_source ON chunks(source)",
)
# A regular (not external-content) FTS5 table: it keeps its own copy of the
# text, which lets a store reopened with FTS5 index rows that a store without
# FTS5 added meanwhile (rowid > max indexed rowid), with no bookkeeping table.
_FTS_SCHEMA = "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, tokenize='porter unicode61')"
_FTS_CATCH_UP = (
    "INSERT INTO chunks_fts(rowid, text) SELECT id, text FROM chunks "
    "WHERE id > (SELECT coalesce(max(rowid), 0) FROM chunks_fts) ORDER BY id"
)


def _fts5_available() -> bool:
    """Whether this Python's SQLite has FTS5 (a module function so tests can pretend not)."""
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE VIRTUAL TABLE probe USING fts5(x)")
        return True
    except sqlite3.Error:
        return False
    finally:
        probe.close()


class SqliteRagStore:
    """The embedded :class:`RagStore`: SQLite with FTS5, plus vectors when given an embedder.

    - Keyword search is FTS5 with BM25 ranking (porter stemming).  The user's
      query never reaches FTS5 syntax: each word is quoted and the words are
      OR-ed, so quotes, ``AND``, ``*``, ``:`` or parentheses are just text.
    - With an ``embedder``, each chunk's unit vector is stored beside its text
      (float32) and search fuses cosine ranking with BM25 ranking by
      reciprocal rank fusion (k=60).  Vectors are compared only with vectors
      of the same model label.  The vector scan is brute force (fine for the
      tool results of one application; pgvector is the way to grow).
    - Thread-safe: one connection shared by all threads and guarded by a
      lock (``:memory:`` databases cannot be shared by per-thread
      connections anyway); embedding calls run outside the lock so a slow
      provider never blocks other searches.  File databases use WAL and a
      busy timeout, so several processes may use one file.
    - Without FTS5 in this Python's SQLite it logs a warning and falls back
      to a LIKE scan ranked by BM25 computed in Python -- slower, never a crash.
    """

    def __init__(
        self,
        path: Any = ":memory:",
        embedder: Optional[Embedder] = None,
        embed_model: Optional[str] = None,
        *,
        logger: Any = None,
        _force_no_fts: bool = False,
    ) -> None:
        self._log = component_logger("streamengine.rag.SqliteRagStore", logger)
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise ConfigError(
                f"embedder must have embed(texts, model), got {type(embedder).__name__}; "
                "use OpenAIEmbedder(client, model) or HashingEmbedder()"
            )
        self.path = os.fspath(path)
        self._embedder = embedder
        self._embed_model = embed_model
        self._lock = threading.Lock()
        self.uses_fts = not _force_no_fts and _fts5_available()
        self._conn: Optional[sqlite3.Connection] = self._connect()
        if not self.uses_fts:
            self._log.warning(
                "FTS5 is unavailable (SQLite {}): the RAG store at {!r} falls back to a LIKE scan "
                "(slower, no stemming); use a Python whose SQLite includes FTS5",
                sqlite3.sqlite_version, self.path,
            )

    # -- setup ---------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a
            # writer takes the write lock up front instead of failing to
            # upgrade a read lock when another process writes.
            conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise ConfigError(
                f"cannot open the RAG store at {self.path!r} ({exc}); check the directory exists and is writable"
            ) from exc
        try:
            if self.path not in ("", ":memory:"):
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            self._create_schema(conn)
        except ConfigError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise ConfigError(
                f"cannot use {self.path!r} as a RAG store ({exc}); is it an SQLite file made by streamengine?"
            ) from exc
        return conn

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise ConfigError(
                    f"the RAG store at {self.path!r} has schema version {version}, newer than this "
                    f"streamengine understands ({_SCHEMA_VERSION}); upgrade streamengine"
                )
            for statement in _SCHEMA:  # not executescript(): it would COMMIT our BEGIN first
                conn.execute(statement)
            if self.uses_fts:
                conn.execute(_FTS_SCHEMA)
                conn.execute(_FTS_CATCH_UP)
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back already (disk full)
                conn.execute("ROLLBACK")
            raise

    def _require_open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StreamEngineError(f"the RAG store at {self.path!r} is closed; create a new SqliteRagStore")
        return self._conn

    # -- RagStore ------------------------------------------------------------

    def add_chunks(self, source: str, chunks: Sequence[str], embed_model: Optional[str] = None) -> int:
        """Store the non-blank ``chunks`` under ``source``; returns how many were stored.

        Embedding failures never raise: they are logged and the text is
        stored without vectors.  Database errors do raise (StreamEngineError).
        """
        _check_source(source, allow_none=False)
        texts = _clean_chunks(chunks)
        if not texts:
            return 0
        self._require_open()  # before a possibly slow embedding call
        blobs, label = self._embed_for_storage(source, texts, embed_model)
        with self._lock:
            conn = self._require_open()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for text, blob in zip(texts, blobs):
                        row = conn.execute(
                            "INSERT INTO chunks(source, text, embed_model, vector) VALUES (?, ?, ?, ?)",
                            (source, text, label if blob is not None else None, blob),
                        )
                        if self.uses_fts:
                            conn.execute("INSERT INTO chunks_fts(rowid, text) VALUES (?, ?)", (row.lastrowid, text))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:  # SQLite may have rolled back already (disk full)
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StreamEngineError(
                    f"the RAG store at {self.path!r} could not store {len(texts)} chunk(s) of {source!r}: {exc}"
                ) from exc
        return len(texts)

    def search(self, query: str, k: int = 5, source: Optional[str] = None) -> List[Hit]:
        """The ``k`` best chunks for ``query``, best first; never raises for odd query text.

        BM25 only without an embedder (``score`` = -bm25); with one, cosine
        and BM25 rankings fused by RRF (``score`` = fused score).  If the
        query cannot be embedded, BM25 alone answers.
        """
        if not isinstance(query, str):
            raise ConfigError(f"search query must be a str, got {type(query).__name__}")
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ConfigError(f"k must be a positive int (how many hits), got {k!r}")
        _check_source(source, allow_none=True)
        if not query.strip():
            return []
        self._require_open()  # before a possibly slow query embedding
        depth = max(_MIN_CANDIDATES, 4 * k)
        query_vector = self._embed_query(query)
        label = self._label(self._embed_model)
        with self._lock:
            conn = self._require_open()
            keyword = self._keyword_ranking(conn, query, depth, source)
            vector_rows = self._vector_rows(conn, label, source) if query_vector is not None else []
        if query_vector is None:
            best = keyword[:k]
        else:
            semantic = _cosine_ranking(query_vector, vector_rows, depth)
            best = _reciprocal_rank_fusion([[i for i, _ in keyword], [i for i, _ in semantic]])[:k]
        return self._hits(best)

    def close(self) -> None:
        """Close the connection; later calls raise StreamEngineError.  Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- extras (not part of the protocol) -------------------------------------

    def count(self, source: Optional[str] = None) -> int:
        """How many chunks are stored, optionally for one ``source``."""
        _check_source(source, allow_none=True)
        with self._lock:
            conn = self._require_open()
            if source is None:
                return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
            return conn.execute("SELECT count(*) FROM chunks WHERE source = ?", (source,)).fetchone()[0]

    def __enter__(self) -> "SqliteRagStore":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "fts5" if self.uses_fts else "like"
        return f"SqliteRagStore({self.path!r}, {mode}, embedder={type(self._embedder).__name__ if self._embedder else None})"

    # -- embedding ------------------------------------------------------------

    def _label(self, model: Optional[str]) -> Optional[str]:
        """The model name stored with vectors: only same-label vectors are compared."""
        if self._embedder is None:
            return None
        return model or getattr(self._embedder, "model", None) or type(self._embedder).__name__

    def _embed_for_storage(self, source: str, texts: List[str],
                           embed_model: Optional[str]) -> Tuple[List[Optional[bytes]], Optional[str]]:
        if self._embedder is None:
            return [None] * len(texts), None
        model = embed_model or self._embed_model
        try:
            blobs = _pack_vectors(self._embedder.embed(texts, model), len(texts))
        except Exception as exc:  # ingestion must never fail the request
            self._log.warning(
                "embedding {} chunk(s) of {!r} with model {!r} failed ({}: {}); stored the text without "
                "vectors, so it is found by keywords only",
                len(texts), source, self._label(model), type(exc).__name__, exc,
            )
            return [None] * len(texts), None
        return blobs, self._label(model)

    def _embed_query(self, query: str) -> Optional[List[float]]:
        if self._embedder is None:
            return None
        try:
            vectors = list(self._embedder.embed([query], self._embed_model))
            if len(vectors) != 1:
                raise ValueError(f"embedder returned {len(vectors)} vectors for 1 query")
            return _unit_vector(vectors[0])
        except Exception as exc:
            self._log.warning(
                "embedding the search query failed ({}: {}); ranking by keywords (BM25) only",
                type(exc).__name__, exc,
            )
            return None

    # -- ranking --------------------------------------------------------------

    def _keyword_ranking(self, conn: sqlite3.Connection, query: str, depth: int,
                         source: Optional[str]) -> List[Tuple[int, float]]:
        tokens = _query_tokens(query)
        if not tokens:
            return []
        try:
            if self.uses_fts:
                return _fts_ranking(conn, tokens, depth, source)
            return _like_ranking(conn, tokens, depth, source)
        except sqlite3.Error as exc:
            # Quoting makes this unreachable for query text; kept so that a
            # surprise (a corrupt index, an SQLite quirk) degrades to no
            # keyword hits instead of failing the tool call.
            self._log.warning("keyword search failed ({}); returning no keyword hits", exc)
            return []

    def _vector_rows(self, conn: sqlite3.Connection, label: Optional[str],
                     source: Optional[str]) -> List[Tuple[int, bytes]]:
        sql = "SELECT id, vector FROM chunks WHERE vector IS NOT NULL AND embed_model IS ?"
        params: List[Any] = [label]
        if source is not None:
            sql += " AND source = ?"
            params.append(source)
        return conn.execute(sql, params).fetchall()

    def _hits(self, ranked: Sequence[Tuple[int, float]]) -> List[Hit]:
        if not ranked:
            return []
        ids = [row_id for row_id, _ in ranked]
        with self._lock:
            conn = self._require_open()
            rows = conn.execute(
                f"SELECT id, source, text FROM chunks WHERE id IN ({','.join('?' * len(ids))})", ids
            ).fetchall()
        by_id = {row_id: (src, text) for row_id, src, text in rows}
        return [Hit(by_id[i][0], by_id[i][1], score) for i, score in ranked if i in by_id]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _check_source(source: Any, allow_none: bool) -> None:
    if source is None and allow_none:
        return
    if not isinstance(source, str) or not source:
        raise ConfigError(f"source must be a non-empty str such as 'tool:fetch:call_1', got {source!r}")


def _clean_chunks(chunks: Any) -> List[str]:
    if isinstance(chunks, str):
        raise ConfigError("chunks must be a list of str, not one str; pass [text] or chunks_for_ingest(text)")
    texts = list(chunks)
    for item in texts:
        if not isinstance(item, str):
            raise ConfigError(f"every chunk must be a str, got {type(item).__name__}")
    return [text for text in texts if text.strip()]


def _query_tokens(query: str) -> List[str]:
    """Distinct lower-case words of the query, in order, at most 64."""
    tokens: List[str] = []
    for token in _TOKEN_RE.findall(query.lower()):
        if token not in tokens:
            tokens.append(token)
            if len(tokens) == _MAX_QUERY_TOKENS:
                break
    return tokens


def _fts_expression(tokens: Sequence[str]) -> str:
    """A MATCH expression that is always valid: each token a quoted string, OR-ed.

    Inside double quotes FTS5 sees only a phrase, never an operator,
    column filter or prefix star; a quote inside is escaped by doubling.
    """
    return " OR ".join('"' + token.replace('"', '""') + '"' for token in tokens)


def _fts_ranking(conn: sqlite3.Connection, tokens: Sequence[str], depth: int,
                 source: Optional[str]) -> List[Tuple[int, float]]:
    expression = _fts_expression(tokens)
    if source is None:
        rows = conn.execute(
            "SELECT rowid, rank FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY rank, rowid LIMIT ?",
            (expression, depth),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT chunks_fts.rowid, chunks_fts.rank FROM chunks_fts JOIN chunks ON chunks.id = chunks_fts.rowid "
            "WHERE chunks_fts MATCH ? AND chunks.source = ? ORDER BY chunks_fts.rank, chunks_fts.rowid LIMIT ?",
            (expression, source, depth),
        ).fetchall()
    # bm25() is "lower is better" and negative; flip it so higher is better.
    return [(row_id, -rank) for row_id, rank in rows]


def _like_ranking(conn: sqlite3.Connection, tokens: Sequence[str], depth: int,
                  source: Optional[str]) -> List[Tuple[int, float]]:
    """The no-FTS5 fallback: LIKE finds candidates, BM25 computed here ranks them.

    Same formula as FTS5's ``bm25()`` but without stemming, and document
    lengths are averaged over the candidates only (the whole table would
    cost a full scan): close to FTS5's ranking, not equal.
    """
    where = " OR ".join("text LIKE ? ESCAPE '\\'" for _ in tokens)
    params: List[Any] = ["%" + _like_escape(token) + "%" for token in tokens]
    total_sql = "SELECT count(*) FROM chunks"
    sql = f"SELECT id, text FROM chunks WHERE ({where})"
    if source is not None:
        sql += " AND source = ?"
        total_sql += " WHERE source = ?"
        params.append(source)
    rows = conn.execute(sql, params).fetchall()
    total = conn.execute(total_sql, () if source is None else (source,)).fetchone()[0]
    matches: List[Tuple[int, Dict[str, int], int]] = []
    document_frequency: Counter = Counter()
    for row_id, text in rows:
        counts = Counter(_TOKEN_RE.findall(text.lower()))
        found = {token: counts[token] for token in tokens if counts[token]}
        if found:  # LIKE matches substrings; keep whole-word matches only
            matches.append((row_id, found, sum(counts.values())))
            document_frequency.update(found.keys())
    if not matches:
        return []
    average_length = sum(length for _, _, length in matches) / len(matches)
    scored = [
        (row_id, _bm25(found, length, average_length, document_frequency, total))
        for row_id, found, length in matches
    ]
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored[:depth]


def _bm25(found: Dict[str, int], length: int, average_length: float, document_frequency: Counter,
          total: int, k1: float = 1.2, b: float = 0.75) -> float:
    score = 0.0
    for token, tf in found.items():
        df = document_frequency[token]
        # FTS5's own idf, clamped the same way, so both paths rank alike.
        idf = max(math.log((total - df + 0.5) / (df + 0.5)), 1e-6)
        score += idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * length / average_length))
    return score


def _like_escape(token: str) -> str:
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _unit_vector(values: Iterable[Any]) -> Optional[List[float]]:
    """The vector scaled to length 1; None when empty, zero or not finite."""
    vector = [float(x) for x in values]
    norm = math.sqrt(sum(x * x for x in vector))
    if not vector or not math.isfinite(norm) or norm == 0.0:
        return None
    return [x / norm for x in vector]


def _pack_vectors(vectors: Any, expected: int) -> List[Optional[bytes]]:
    """Unit float32 blobs, little-endian; raises ValueError on a malformed answer."""
    vectors = list(vectors)
    if len(vectors) != expected:
        raise ValueError(f"embedder returned {len(vectors)} vectors for {expected} texts")
    blobs: List[Optional[bytes]] = []
    for vector in vectors:
        unit = _unit_vector(vector)
        blobs.append(None if unit is None else _to_blob(unit))
    return blobs


def _to_blob(vector: Sequence[float]) -> bytes:
    packed = array("f", vector)
    if sys.byteorder == "big":  # files stay portable between machines
        packed.byteswap()
    return packed.tobytes()


def _from_blob(blob: bytes) -> array:
    packed = array("f")
    packed.frombytes(blob)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed


def _cosine_ranking(query: Sequence[float], rows: Sequence[Tuple[int, bytes]],
                    depth: int) -> List[Tuple[int, float]]:
    """The ``depth`` most similar rows with positive cosine (all vectors are unit length)."""
    scored = []
    for row_id, blob in rows:
        vector = _from_blob(blob)
        if len(vector) != len(query):
            continue  # another dimension: same label but a different model setting
        score = sum(map(operator.mul, query, vector))
        if score > 0.0:
            scored.append((row_id, score))
    return heapq.nsmallest(depth, scored, key=lambda item: (-item[1], item[0]))


def _reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> List[Tuple[int, float]]:
    """Fuse rankings of ids: each id scores the sum of 1 / (k + rank) over the rankings."""
    scores: Dict[int, float] = {}
    for ranking in rankings:
        for rank, row_id in enumerate(ranking, start=1):
            scores[row_id] = scores.get(row_id, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))
