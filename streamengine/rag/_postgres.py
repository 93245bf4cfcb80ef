"""The shared store: PostgreSQL, so several processes (gunicorn workers) search one corpus.

Same contract and query meaning as :class:`~streamengine.rag._sqlite.SqliteRagStore`
(the same query words, OR-ed; the same fusion); only the engine underneath differs.
psycopg is imported when a store is made, so ``import streamengine`` never needs it.
"""
from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import unquote

from .. import _validation as validation
from .._errors import ConfigError, StreamEngineError
from .._logs import Redactor, component_logger, redact_urls
from ._base import (
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

DSN_ENV = "STREAMENGINE_RAG_DSN"
_TABLE_RE = re.compile(r"[a-z_][a-z0-9_]{0,46}\Z")  # leaves room for the index name suffixes
# 'english': Snowball stemming, like SQLite's porter tokenizer (it also drops stop words).
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " source text NOT NULL,"
    " text text NOT NULL,"
    " tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,"
    " embed_model text,"
    " vector float8[],"
    " scope text NOT NULL DEFAULT '')",
    # A table made before scopes existed: its rows get scope '', which no run searches.
    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT ''",
    "CREATE INDEX IF NOT EXISTS {table_tsv} ON {table} USING gin (tsv)",
    "CREATE INDEX IF NOT EXISTS {table_source} ON {table} (source)",
    "CREATE INDEX IF NOT EXISTS {table_scope} ON {table} (scope, id)",
)
# One row per distinct query term: its tsquery and a BM25 idf over the scope
# (whatever the source filter; another scope's words never weigh in), never negative.
_TERMS = (
    "SELECT t.q::text, ln(1 + (n.total - d.df + 0.5) / (d.df + 0.5))::float8"
    " FROM (SELECT DISTINCT plainto_tsquery('english', token) AS q FROM unnest(%(tokens)s::text[]) AS token) AS t"
    " CROSS JOIN LATERAL (SELECT count(*) AS df FROM {table} WHERE tsv @@ t.q AND scope = %(scope)s) AS d"
    " CROSS JOIN (SELECT count(*) AS total FROM {table} WHERE scope = %(scope)s) AS n"
    " WHERE numnode(t.q) > 0"
)
# Any term matches (the GIN index finds the rows); each term adds idf * ts_rank,
# ts_rank growing with the term's count and normalised by document length.
_KEYWORD_RANKING = (
    "SELECT c.id, (SELECT sum(w.idf * ts_rank(c.tsv, w.q::tsquery, 1))"
    " FROM unnest(%(terms)s::text[], %(idfs)s::float8[]) AS w(q, idf)) AS score"
    " FROM {table} AS c WHERE c.tsv @@ %(any)s::tsquery AND c.scope = %(scope)s{source_filter}"
    " ORDER BY score DESC, c.id LIMIT %(depth)s"
)
# Stored vectors are unit length, so the dot product is the cosine.
_COSINE_ARRAYS = "(SELECT sum(a * b) FROM unnest(c.vector, %(vector)s::float8[]) AS p(a, b))"
_COSINE_PGVECTOR = "(1 - (c.vector::vector <=> %(vector)s::float8[]::vector))"
_COSINE_RANKING = (
    "SELECT id, score FROM (SELECT c.id, {cosine} AS score FROM {table} AS c"
    " WHERE c.scope = %(scope)s AND c.embed_model = %(label)s AND cardinality(c.vector) = %(dim)s{source_filter}) AS s"
    " WHERE score > 0 ORDER BY score DESC, id LIMIT %(depth)s"
)


_KEY_VALUE_PASSWORD = re.compile(r"(password\s*=\s*)('(?:\\.|[^'\\])*'|[^\s&]+)")


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and logs.

    The URL form is masked like every URL (``_logs.Redactor``: userinfo and query
    values); the key=value form loses its ``password=`` value.
    """
    return _KEY_VALUE_PASSWORD.sub(r"\1***", redact_urls(dsn))


def _dsn_redactor(dsn: str) -> Redactor:
    """Hides the DSN's password wherever the driver's message quotes it, in a URL or on its own."""
    passwords = [match.group(2).strip("'") for match in _KEY_VALUE_PASSWORD.finditer(dsn)]
    userinfo, at, _ = dsn.partition("://")[2].partition("/")[0].rpartition("@")
    if at:
        password = userinfo.partition(":")[2]
        passwords += [password, unquote(password)]
    return Redactor(passwords)


def _import_psycopg() -> Tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ConfigError(
            f"PostgresRagStore needs psycopg 3 and psycopg_pool ({exc}); "
            "install them with: pip install 'streamengine[postgres]'"
        ) from exc
    return psycopg, psycopg_pool


def _storable(text: str) -> str:
    """PostgreSQL text cannot hold NUL: in a source it becomes U+FFFD, as in chunks (base)."""
    return text.replace("\x00", "\ufffd")


class PostgresRagStore(_StoreBase):
    """A :class:`RagStore` in PostgreSQL, shared by every process that opens the same DSN.

    - Keyword search: a generated ``tsvector`` column ('english' stemming)
      with a GIN index.  Any query word may match (the words are OR-ed, never
      parsed as tsquery syntax); each matching word adds ``idf * ts_rank``,
      with a BM25 idf over the whole table, so rarer words and more
      occurrences rank higher.
    - Vectors: unit vectors stored beside the text as ``float8[]``; cosine is
      exact and computed in SQL -- with pgvector's ``<=>`` when the
      ``vector`` extension is installed (or installable) in the database,
      else as a dot product over ``unnest`` of the arrays.  Fused with the
      keyword ranking by RRF exactly as the SQLite store does.
    - Every row has a ``scope``; a search sees only its own scope's rows (the
      filter is in each query, on the ``(scope, id)`` index).  A table from
      before scopes gets the column on first open, its rows scope ``''``.
    - Every wait is bounded: a pooled connection by ``connect_timeout``, a
      statement or lock by ``statement_timeout`` (the server's
      ``statement_timeout`` and ``lock_timeout``).
    - Each ``add_chunks`` is one transaction on a pooled connection
      (``psycopg_pool.ConnectionPool``, ``pool_size`` connections at most), so
      concurrent writers in any number of processes lose nothing.
    - The schema is created by the first store to open the database, under a
      transaction-scoped advisory lock, so workers starting together do not
      collide; ``table`` lets several corpora share one database.

    ``dsn`` defaults to ``$STREAMENGINE_RAG_DSN``.  Create the store in each
    process (after a fork), never before forking: a pool does not survive it.
    """

    def __init__(
        self,
        dsn: Optional[str] = None,
        embedder: Optional[Embedder] = None,
        embed_model: Optional[str] = None,
        *,
        table: str = "streamengine_rag_chunks",
        pool_size: int = 4,
        connect_timeout: float = 5.0,
        statement_timeout: float = 5.0,
        logger: Optional[Logger] = None,
        _force_no_pgvector: bool = False,
    ) -> None:
        self._log = component_logger("streamengine.rag.PostgresRagStore", logger)
        self._embedding = _StoreEmbedding(embedder, embed_model, self._log)
        self.dsn = _resolve_dsn(dsn)
        self.safe_dsn = redact_dsn(self.dsn)
        self._redact = _dsn_redactor(self.dsn)
        self.table = _check_table(table)
        validation.count(pool_size, "pool_size (connections per process)", minimum=1)
        self.statement_timeout = validation.seconds(statement_timeout, "statement_timeout")
        self._psycopg, psycopg_pool = _import_psycopg()
        self._lock = threading.Lock()
        self.uses_pgvector = self._create_schema(max(2, int(connect_timeout)), _force_no_pgvector)
        self._pool: Any = self._open_pool(psycopg_pool, pool_size, connect_timeout)

    # -- setup ---------------------------------------------------------------

    def _sql(self, template: str, source_filter: str = "") -> Any:
        """A statement for this store's table; the table name is quoted, never pasted."""
        sql = self._psycopg.sql
        return sql.SQL(template).format(
            table=sql.Identifier(self.table), table_tsv=sql.Identifier(f"{self.table}_tsv"),
            table_source=sql.Identifier(f"{self.table}_source"), source_filter=sql.SQL(source_filter),
            table_scope=sql.Identifier(f"{self.table}_scope"),
            cosine=sql.SQL(_COSINE_PGVECTOR if self.uses_pgvector else _COSINE_ARRAYS),
        )

    def _create_schema(self, connect_timeout: int, force_no_pgvector: bool) -> bool:
        """Create the table and indexes if missing; whether pgvector ranks the vectors."""
        self.uses_pgvector = False
        try:
            with self._psycopg.connect(self.dsn, connect_timeout=connect_timeout) as conn:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"streamengine.rag:{self.table}"])
                    uses_pgvector = not force_no_pgvector and self._ensure_pgvector(conn)
                    for statement in _SCHEMA:
                        conn.execute(self._sql(statement))
                return uses_pgvector
        except self._psycopg.Error as exc:
            raise ConfigError(
                f"cannot use the PostgreSQL RAG store at {self.safe_dsn} "
                f"({type(exc).__name__}: {self._redact(str(exc))}); "
                f"check that the server runs and accepts this DSN (dsn= or ${DSN_ENV}) and that the user "
                "may create tables in the database"
            ) from exc

    def _ensure_pgvector(self, conn: Any) -> bool:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
            return True
        if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
            return False
        try:
            with conn.transaction():  # a savepoint: a refusal leaves the schema work going
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            return True
        except self._psycopg.Error as exc:
            self._log.warning(
                "the server has pgvector but CREATE EXTENSION vector failed ({}); cosine runs on float8[] "
                "in SQL instead (exact, slower); a superuser can run CREATE EXTENSION vector in the database",
                exc,
            )
            return False

    def _open_pool(self, psycopg_pool: Any, pool_size: int, connect_timeout: float) -> Any:
        options: Dict[str, Any] = {}
        if hasattr(psycopg_pool.ConnectionPool, "check_connection"):  # psycopg_pool >= 3.2
            options["check"] = psycopg_pool.ConnectionPool.check_connection  # survives a server restart
        # Every wait is bounded: for a pooled connection (server down) by connect_timeout, for
        # a statement or a lock (a locked table) by statement_timeout, enforced by the server.
        millis = max(1, int(self.statement_timeout * 1000))
        pool = psycopg_pool.ConnectionPool(
            self.dsn, min_size=1, max_size=pool_size, open=False, num_workers=1, timeout=float(connect_timeout),
            name=f"streamengine-rag-{self.table}",
            kwargs={"connect_timeout": max(2, int(connect_timeout)),
                    "options": f"-c statement_timeout={millis} -c lock_timeout={millis}"},
            **options,
        )
        try:
            pool.open(wait=True, timeout=connect_timeout)
        except self._psycopg.Error as exc:
            pool.close()
            raise ConfigError(
                f"cannot open a connection pool to the PostgreSQL RAG store at {self.safe_dsn} "
                f"({self._redact(str(exc))}); "
                "check the server's max_connections and that it still accepts this DSN"
            ) from exc
        return pool

    def _require_open(self) -> Any:
        pool = self._pool
        if pool is None:
            raise StreamEngineError(f"the RAG store at {self.safe_dsn} is closed; create a new PostgresRagStore")
        return pool

    @contextmanager
    def _connection(self, doing: str) -> Iterator[Any]:
        """A pooled connection in one transaction (committed on success); errors name the store."""
        pool = self._require_open()
        try:
            with pool.connection() as conn:
                yield conn
        except self._psycopg.Error as exc:
            raise StreamEngineError(
                f"the PostgreSQL RAG store at {self.safe_dsn} could not {doing} "
                f"({type(exc).__name__}: {self._redact(str(exc))}); is the server up?"
            ) from exc

    # -- RagStore ------------------------------------------------------------

    def _insert(self, rows: List[Tuple[str, str, str]], vectors: List[Optional[List[float]]],
                label: Optional[str], what: str) -> None:
        """One transaction on a pooled connection; psycopg sends the rows pipelined."""
        values = [(_storable(source), text, None if vector is None else label, vector, scope)
                  for (source, text, scope), vector in zip(rows, vectors)]
        insert = self._sql("INSERT INTO {table} (source, text, embed_model, vector, scope) "
                           "VALUES (%s, %s, %s, %s, %s)")
        with self._connection(f"store {what}") as conn, conn.cursor() as cursor:
            cursor.executemany(insert, values)

    def search(self, query: str, k: int = 5, source: Optional[str] = None, *, scope: str = "") -> List[Hit]:
        """The ``k`` best chunks of ``scope`` for ``query``, best first; never raises for odd query text.

        Keywords only without an embedder (``score`` = the idf-weighted rank);
        with one, keyword and cosine rankings fused by RRF (``score`` = fused
        score).  If the query cannot be embedded, keywords alone answer.
        """
        searchable, query_vector = self._checked_query(query, k, source, scope)
        if not searchable:
            return []
        depth = _candidate_depth(k)
        tokens = _query_tokens(query)
        within = (scope, None if source is None else _storable(source))
        with self._connection("search") as conn:
            keyword = self._keyword_ranking(conn, tokens, depth, within) if tokens else []
            semantic = None if query_vector is None else self._cosine_ranking(conn, query_vector, depth, within)
            return self._hits(conn, _fuse_or_keywords(keyword, semantic, k))

    def close(self) -> None:
        """Close the pool (its connections and threads); later calls raise StreamEngineError.  Idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- extras (not part of the protocol) -------------------------------------

    def count(self, source: Optional[str] = None) -> int:
        """How many chunks are stored, optionally for one ``source``."""
        _check_source(source, allow_none=True)
        with self._connection("count chunks") as conn:
            if source is None:
                return int(conn.execute(self._sql("SELECT count(*) FROM {table}")).fetchone()[0])
            return int(conn.execute(self._sql("SELECT count(*) FROM {table} WHERE source = %s"),
                                    [_storable(source)]).fetchone()[0])

    def __repr__(self) -> str:
        mode = "pgvector" if self.uses_pgvector else "float8[]"
        embedder = self._embedding.embedder
        return (f"PostgresRagStore({self.safe_dsn!r}, table={self.table!r}, {mode}, "
                f"embedder={type(embedder).__name__ if embedder else None})")

    # -- ranking --------------------------------------------------------------

    def _keyword_ranking(self, conn: Any, tokens: List[str], depth: int,
                         within: Tuple[str, Optional[str]]) -> List[Tuple[int, float]]:
        scope, source = within
        terms = conn.execute(self._sql(_TERMS), {"tokens": tokens, "scope": scope}).fetchall()
        if not terms:  # only stop words
            return []
        params = {
            "terms": [term for term, _ in terms], "idfs": [idf for _, idf in terms],
            "any": " | ".join(f"({term})" for term, _ in terms), "depth": depth, "source": source, "scope": scope,
        }
        sql = self._sql(_KEYWORD_RANKING, "" if source is None else " AND c.source = %(source)s")
        return [(row_id, score) for row_id, score in conn.execute(sql, params).fetchall()]

    def _cosine_ranking(self, conn: Any, vector: List[float], depth: int,
                        within: Tuple[str, Optional[str]]) -> List[Tuple[int, float]]:
        scope, source = within
        params = {"vector": vector, "dim": len(vector), "label": self._embedding.label(),
                  "depth": depth, "source": source, "scope": scope}
        sql = self._sql(_COSINE_RANKING, "" if source is None else " AND c.source = %(source)s")
        return [(row_id, score) for row_id, score in conn.execute(sql, params).fetchall()]

    def _hits(self, conn: Any, ranked: Sequence[Tuple[int, float]]) -> List[Hit]:
        if not ranked:
            return []
        rows = conn.execute(self._sql("SELECT id, source, text FROM {table} WHERE id = ANY(%s)"),
                            [[row_id for row_id, _ in ranked]]).fetchall()
        return _hits_in_order(ranked, rows)


def _resolve_dsn(dsn: Optional[str]) -> str:
    dsn = dsn if dsn is not None else os.environ.get(DSN_ENV)
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigError(
            f"PostgresRagStore needs a DSN such as 'postgresql://user:password@host:5432/dbname': "
            f"pass dsn= or set ${DSN_ENV}"
        )
    return dsn


def _check_table(table: object) -> str:
    if not isinstance(table, str) or not _TABLE_RE.match(table):
        raise ConfigError(
            f"table must be a lower-case SQL name of at most 47 letters, digits or '_' "
            f"(such as 'streamengine_rag_chunks'), got {table!r}"
        )
    return table
