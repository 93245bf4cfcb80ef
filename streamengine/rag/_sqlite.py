"""The embedded default store: SQLite + FTS5 (BM25), cosine fused by RRF with an embedder.

Ingestion must never fail the request, so embedding problems are logged and
the text is stored without vectors (it is then found by keywords only).
"""
from __future__ import annotations

import heapq
import math
import operator
import os
import sqlite3
import sys
import threading
from array import array
from collections import Counter
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from .. import _validation as validation
from .._errors import ConfigError, StreamEngineError
from .._logs import component_logger
from ._base import (
    _TOKEN_RE,
    Embedder,
    Hit,
    _candidate_depth,
    _check_source,
    _fuse_or_keywords,
    _hits_in_order,
    _query_tokens,
    _StoreBase,
    _StoreEmbedding,
)

if TYPE_CHECKING:
    from loguru import Logger

# ---------------------------------------------------------------------------
# SQLite store
# ---------------------------------------------------------------------------

#: 2: every row has a ``scope`` (rows of version 1 get ``''``, the scope no run searches).
_SCHEMA_VERSION = 2
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, source TEXT NOT NULL, "
    "text TEXT NOT NULL, embed_model TEXT, vector BLOB, scope TEXT NOT NULL DEFAULT '')",
    "CREATE INDEX IF NOT EXISTS chunks_by_source ON chunks(source)",
)
_SCOPE_COLUMN = "ALTER TABLE chunks ADD COLUMN scope TEXT NOT NULL DEFAULT ''"
_SCOPE_INDEX = "CREATE INDEX IF NOT EXISTS chunks_by_scope ON chunks(scope, source)"
# A regular (not external-content) FTS5 table: it keeps its own copy of the
# text, which lets a store reopened with FTS5 index rows that a store without
# FTS5 added meanwhile (rowid > max indexed rowid), with no bookkeeping table.
_FTS_SCHEMA = "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, tokenize='porter unicode61')"
_INSERT = "INSERT INTO chunks(source, text, embed_model, vector, scope) VALUES "
# 5 values a row, and SQLite may allow only 999 in one statement (before 3.32).
_ROWS_PER_INSERT = 199
_FTS_INDEX_NEW = "INSERT INTO chunks_fts(rowid, text) SELECT id, text FROM chunks WHERE id > ? ORDER BY id"
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


class SqliteRagStore(_StoreBase):
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
      busy timeout (``busy_timeout``, 2 s: a file locked longer by another
      process fails that call, as a filing error or an empty search, rather
      than holding the caller), so several processes may use one file.
    - Every row has a ``scope``; a search sees only its own scope's rows
      (the filter is in the query, on an index).
    - Without FTS5 in this Python's SQLite it logs a warning and falls back
      to a LIKE scan ranked by BM25 computed in Python -- slower, never a crash.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike[str]] = ":memory:",
        embedder: Optional[Embedder] = None,
        embed_model: Optional[str] = None,
        *,
        logger: Optional[Logger] = None,
        busy_timeout: float = 2.0,
        _force_no_fts: bool = False,
    ) -> None:
        self._log = component_logger("streamengine.rag.SqliteRagStore", logger)
        self.busy_timeout = validation.seconds(busy_timeout, "busy_timeout")
        self._embedding = _StoreEmbedding(embedder, embed_model, self._log)
        self.path = os.fspath(path)
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
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, check_same_thread=False,
                                   isolation_level=None)
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
            if "scope" not in [row[1] for row in conn.execute("PRAGMA table_info(chunks)")]:
                conn.execute(_SCOPE_COLUMN)  # a version 1 store: its rows keep scope ''
            conn.execute(_SCOPE_INDEX)
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

    def _insert(self, rows: List[Tuple[str, str, str]], vectors: List[Optional[List[float]]],
                label: Optional[str], what: str) -> None:
        """One transaction; the keyword index gets the new rows in one statement (their ids follow the old
        largest: the write lock is held), so a batch costs a few statements, not two per chunk."""
        values = [(source, text, None if vector is None else label, None if vector is None else _to_blob(vector), scope)
                  for (source, text, scope), vector in zip(rows, vectors)]
        with self._lock:
            conn = self._require_open()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    last = conn.execute("SELECT coalesce(max(id), 0) FROM chunks").fetchone()[0]
                    for start in range(0, len(values), _ROWS_PER_INSERT):
                        part = values[start:start + _ROWS_PER_INSERT]
                        conn.execute(_INSERT + ", ".join(["(?, ?, ?, ?, ?)"] * len(part)),
                                     [value for row in part for value in row])
                    if self.uses_fts:
                        conn.execute(_FTS_INDEX_NEW, (last,))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:  # SQLite may have rolled back already (disk full)
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StreamEngineError(f"the RAG store at {self.path!r} could not store {what}: {exc}") from exc

    def search(self, query: str, k: int = 5, source: Optional[str] = None, *, scope: str = "") -> List[Hit]:
        """The ``k`` best chunks of ``scope`` for ``query``, best first; never raises for odd query text.

        BM25 only without an embedder (``score`` = -bm25); with one, cosine
        and BM25 rankings fused by RRF (``score`` = fused score).  If the
        query cannot be embedded, BM25 alone answers.
        """
        searchable, query_vector = self._checked_query(query, k, source, scope)
        if not searchable:
            return []
        depth = _candidate_depth(k)
        label = self._embedding.label()
        with self._lock:
            conn = self._require_open()
            keyword = self._keyword_ranking(conn, query, depth, source, scope)
            vector_rows = self._vector_rows(conn, label, source, scope) if query_vector is not None else []
        semantic = None if query_vector is None else _cosine_ranking(query_vector, vector_rows, depth)
        return self._hits(_fuse_or_keywords(keyword, semantic, k))

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
                return int(conn.execute("SELECT count(*) FROM chunks").fetchone()[0])
            return int(conn.execute("SELECT count(*) FROM chunks WHERE source = ?", (source,)).fetchone()[0])

    def __repr__(self) -> str:
        mode = "fts5" if self.uses_fts else "like"
        embedder = self._embedding.embedder
        return f"SqliteRagStore({self.path!r}, {mode}, embedder={type(embedder).__name__ if embedder else None})"

    # -- ranking --------------------------------------------------------------

    def _keyword_ranking(self, conn: sqlite3.Connection, query: str, depth: int,
                         source: Optional[str], scope: str) -> List[Tuple[int, float]]:
        tokens = _query_tokens(query)
        if not tokens:
            return []
        try:
            if self.uses_fts:
                return _fts_ranking(conn, tokens, depth, source, scope)
            return _like_ranking(conn, tokens, depth, source, scope)
        except sqlite3.Error as exc:
            # Quoting makes this unreachable for query text; kept so that a
            # surprise (a corrupt index, an SQLite quirk) degrades to no
            # keyword hits instead of failing the tool call.
            self._log.warning("keyword search failed ({}); returning no keyword hits", exc)
            return []

    def _vector_rows(self, conn: sqlite3.Connection, label: Optional[str],
                     source: Optional[str], scope: str) -> List[Tuple[int, bytes]]:
        sql = "SELECT id, vector FROM chunks WHERE scope = ? AND vector IS NOT NULL AND embed_model IS ?"
        params: List[Any] = [scope, label]
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
        return _hits_in_order(ranked, rows)




def _fts_expression(tokens: Sequence[str]) -> str:
    """A MATCH expression that is always valid: each token a quoted string, OR-ed.

    Inside double quotes FTS5 sees only a phrase, never an operator,
    column filter or prefix star; a quote inside is escaped by doubling.
    """
    return " OR ".join('"' + token.replace('"', '""') + '"' for token in tokens)


def _fts_ranking(conn: sqlite3.Connection, tokens: Sequence[str], depth: int,
                 source: Optional[str], scope: str) -> List[Tuple[int, float]]:
    expression = _fts_expression(tokens)
    sql = ("SELECT chunks_fts.rowid, chunks_fts.rank FROM chunks_fts JOIN chunks ON chunks.id = chunks_fts.rowid "
           "WHERE chunks_fts MATCH ? AND chunks.scope = ?")
    params: List[Any] = [expression, scope]
    if source is not None:
        sql += " AND chunks.source = ?"
        params.append(source)
    rows = conn.execute(sql + " ORDER BY chunks_fts.rank, chunks_fts.rowid LIMIT ?", params + [depth]).fetchall()
    # bm25() is "lower is better" and negative; flip it so higher is better.
    return [(row_id, -rank) for row_id, rank in rows]


def _like_ranking(conn: sqlite3.Connection, tokens: Sequence[str], depth: int,
                  source: Optional[str], scope: str) -> List[Tuple[int, float]]:
    """The no-FTS5 fallback: LIKE finds candidates, BM25 computed here ranks them.

    Same formula as FTS5's ``bm25()`` but without stemming, and document
    lengths are averaged over the candidates only (the whole table would
    cost a full scan): close to FTS5's ranking, not equal.
    """
    where = " OR ".join("text LIKE ? ESCAPE '\\'" for _ in tokens)
    params: List[Any] = ["%" + _like_escape(token) + "%" for token in tokens]
    total_sql = "SELECT count(*) FROM chunks WHERE scope = ?"
    sql = f"SELECT id, text FROM chunks WHERE ({where}) AND scope = ?"
    params.append(scope)
    total_params: List[Any] = [scope]
    if source is not None:
        sql += " AND source = ?"
        total_sql += " AND source = ?"
        params.append(source)
        total_params.append(source)
    rows = conn.execute(sql, params).fetchall()
    total = conn.execute(total_sql, total_params).fetchone()[0]
    matches: List[Tuple[int, Dict[str, int], int]] = []
    document_frequency: Counter[str] = Counter()
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


def _bm25(found: Dict[str, int], length: int, average_length: float, document_frequency: Counter[str],
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


def _to_blob(vector: Sequence[float]) -> bytes:
    packed = array("f", vector)
    if sys.byteorder == "big":  # files stay portable between machines
        packed.byteswap()
    return packed.tobytes()


def _from_blob(blob: bytes) -> array[float]:
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
