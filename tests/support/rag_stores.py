"""Making RAG stores of every kind for the contract tests, in this process or another.

The PostgreSQL server comes from ``STREAMENGINE_TEST_PG_DSN`` (``scripts/test``
starts a throwaway one).  Without it the Postgres tests skip with a reason,
except under ``CI=true``, where they fail: CI must never pass by skipping them.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Dict, List

import pytest
from loguru import logger

from streamengine.rag import PostgresRagStore, SqliteRagStore

PG_DSN_ENV = "STREAMENGINE_TEST_PG_DSN"
STORE_KINDS = ["sqlite", "sqlite-like", "postgres"]
STEMMING_KINDS = ["sqlite", "postgres"]  # the LIKE fallback has no stemmer (it warns when it runs)


@pytest.fixture
def warnings_log():
    """Warning records logged by streamengine during the test (import it into a test module)."""
    records = []
    logger.enable("streamengine")
    sink = logger.add(lambda message: records.append(message.record), level="WARNING")
    yield records
    logger.remove(sink)
    logger.disable("streamengine")


@pytest.fixture(params=STORE_KINDS)
def stores(request, tmp_path):
    """A :class:`StoreMaker` for each store kind (import it into a test module); its stores close after."""
    maker = StoreMaker(request.param, tmp_path)
    yield maker
    maker.cleanup()


def postgres_dsn() -> str:
    """The test server's DSN; skips (fails under CI=true) when there is none."""
    dsn = os.environ.get(PG_DSN_ENV)
    if dsn:
        return dsn
    message = (f"no PostgreSQL for the Postgres store tests: ${PG_DSN_ENV} is not set; run the tests through "
               f"scripts/test (it starts a throwaway server) or set {PG_DSN_ENV}=postgresql://user@host/db")
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: these tests must run in CI)", pytrace=False)
    pytest.skip(message)


def drop_tables(dsn: str, tables: List[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(psycopg.sql.Identifier(table)))


class StoreMaker:
    """Makes stores of one kind; each ``new()`` is an empty corpus, ``again()`` reopens one."""

    def __init__(self, kind: str, tmp_path: Any) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.dsn = postgres_dsn() if kind == "postgres" else None
        self.stores: List[Any] = []
        self.tables: List[str] = []

    def new(self, persistent: bool = False, **kwargs: Any) -> Any:
        """An empty store; ``persistent`` SQLite stores live in a file (for other processes)."""
        name = f"rag_{uuid.uuid4().hex[:16]}"
        if self.kind == "postgres":
            self.tables.append(name)
            spec = {"kind": self.kind, "dsn": self.dsn, "table": name}
        else:
            path = str(self.tmp_path / f"{name}.sqlite") if persistent else ":memory:"
            spec = {"kind": self.kind, "path": path}
        return self._open(spec, **kwargs)

    def again(self, store: Any, **kwargs: Any) -> Any:
        """Another instance on the same data (another connection, the same corpus)."""
        return self._open(store.test_spec, **kwargs)

    def _open(self, spec: Dict[str, Any], **kwargs: Any) -> Any:
        store = open_store(spec, **kwargs)
        self.stores.append(store)
        return store

    def cleanup(self) -> None:
        for store in self.stores:
            store.close()
        if self.tables:
            drop_tables(self.dsn, self.tables)


def open_store(spec: Dict[str, Any], **kwargs: Any) -> Any:
    """A store from a spec (a dict that also crosses to subprocesses as JSON)."""
    if spec["kind"] == "postgres":
        store = PostgresRagStore(spec["dsn"], table=spec["table"], **kwargs)
    else:
        store = SqliteRagStore(spec["path"], _force_no_fts=spec["kind"] == "sqlite-like", **kwargs)
    store.test_spec = spec
    return store


# A subprocess that opens the store of spec (argv[1]), waits for "go" on stdin,
# then files and searches; used to run writers in several processes at once.
WRITER_SCRIPT = """
import json, sys
sys.path.insert(0, {tests_dir!r})
from rag_stores import open_store
from streamengine.rag import HashingEmbedder
spec, n = json.loads(sys.argv[1]), int(sys.argv[2])
store = open_store(spec, embedder=HashingEmbedder())
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
for i in range(20):
    store.add_chunks(f"proc{{n}}:{{i}}", [f"process{{n}} item{{i}} shared words", f"second{{n}}x{{i}} chunk"])
    store.search(f"process{{(n + 1) % 3}} shared", k=3)
store.close()
print("done", flush=True)
"""


def writer_script() -> str:
    return WRITER_SCRIPT.format(tests_dir=os.path.dirname(os.path.abspath(__file__)))


def spec_json(store: Any) -> str:
    return json.dumps(store.test_spec)




# ---------------------------------------------------------------------------
# Shared corpora
# ---------------------------------------------------------------------------

HOSTILE_QUERIES = [
    '"', '""', '"unterminated', "AND", "alpha AND", "OR OR", "NOT", "*", "alpha*", "text:alpha",
    "col:", ":", "(", "((alpha", "alpha)", "NEAR(alpha beta)", "-alpha", "^alpha", "+", "{text}: x",
    "alpha' OR '1'='1", "%", "_", "\\", "\x00", "🙂 émoji", "a" * 5000, " ".join([f"w{i}" for i in range(500)]),
    "alpha & beta | !gamma <-> delta:*", "'); DROP TABLE x; --", "$1 %s %(x)s {}", "½ ² ٣ 三",
]

CORPUS = {
    "doc:cats": "Cats sleep most of the day and the cats purr when they are happy.",
    "doc:dogs": "Dogs bark at the mail carrier and the dogs love long walks in the park.",
    "doc:rare": "The quokka is a small marsupial and the quokka lives on Rottnest Island.",
    "doc:park": "The park opens at dawn and the park closes at dusk for the day.",
    "doc:mix": "The day the dogs and the cats met in the park was a happy day.",
}

FUSION_DOCS = {
    "r1": "alpha report on quarterly staffing",
    "r2": "alpha release notes mobile app",
    "r3": "alpha particles stopped by paper",
    "f1": "beta testers liked the new onboarding screens today",
    "f2": "beta version shipped to the early customers last week",
    "f3": "beta blockers lower the resting heart rate a bit",
    "f4": "beta coefficient of the stock versus the market index",
    "f5": "beta decay emits an electron from the nucleus quickly",
    "f6": "beta fish need warm clean water in small tanks",
    "x": "beta beta beta",
}


def fill(store: Any, corpus: Dict[str, str] = CORPUS) -> Any:
    for source, text in corpus.items():
        assert store.add_chunks(source, [text]) == 1
    return store
