"""What is PostgresRagStore's own: DSNs and their errors, the schema race, a failing server,
and two engines in two processes sharing one store.

The contract every store keeps (ranking, scoping, fusion, writers) is in test_rag_contract.py.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import uuid

import pytest
from rag_stores import drop_tables, open_store, postgres_dsn

from streamengine import ConfigError, EngineConfig, OpenAICompatibleClient, StreamEngineError, StreamingEngine
from streamengine.rag import HashingEmbedder, PostgresRagStore
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

DSN_ENV = "STREAMENGINE_RAG_DSN"  # where the store reads its DSN when none is given

pytestmark = pytest.mark.usefixtures("no_thread_leak")

PHRASE = "the heron nests beside quartzite cliffs"


@pytest.fixture
def dsn():
    return postgres_dsn()


@pytest.fixture
def table(dsn, request):
    # Unique per test: workers under pytest-xdist share the database, and names cut to fit may coincide.
    name = "rag_" + request.node.name.lower().replace("[", "_").replace("]", "")[:29] + "_" + uuid.uuid4().hex[:8]
    drop_tables(dsn, [name])
    yield name
    drop_tables(dsn, [name])


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------
# DSN and errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("secret_dsn,shown", [
    # The URL form is masked like every URL: its userinfo and query values.
    ("postgresql://app:s3cr3t@127.0.0.1:{port}/rag", "postgresql://***@127.0.0.1:{port}/rag"),
    ("host=127.0.0.1 port={port} user=app password=s3cr3t dbname=rag",
     "host=127.0.0.1 port={port} user=app password=*** dbname=rag"),
    ("host=127.0.0.1 port={port} password='s3 cr\\'3t' user=app", "host=127.0.0.1 port={port} password=*** user=app"),
    ("postgresql://127.0.0.1:{port}/rag?user=app&password=s3cr3t&sslmode=disable",
     "postgresql://127.0.0.1:{port}/rag?user=***&password=***&sslmode=***"),
    ("postgres://s3cr3t@127.0.0.1:{port}/rag", "postgres://***@127.0.0.1:{port}/rag"),
    ("postgresql://127.0.0.1:{port}/rag", "postgresql://127.0.0.1:{port}/rag"),
])
def test_the_password_never_shows(secret_dsn, shown):
    """The store names the server it could not reach by its DSN, masked."""
    port = _closed_port()
    with pytest.raises(ConfigError) as caught:
        PostgresRagStore(secret_dsn.format(port=port), connect_timeout=2)
    message = str(caught.value)
    assert shown.format(port=port) in message and "s3cr3t" not in message and "s3 cr" not in message


@pytest.mark.parametrize("secret_dsn", [
    "postgresql://app:s3cr3tpass@[bad/rag",  # libpq quotes the whole URL back
    "host=127.0.0.1 port=1 password=s3cr3tpass junk",
])
def test_a_dsn_the_driver_cannot_read_is_refused_without_its_password(secret_dsn):
    with pytest.raises(ConfigError) as caught:
        PostgresRagStore(secret_dsn, connect_timeout=2)
    assert "s3cr3tpass" not in str(caught.value) and "s3cr3tpass" not in repr(caught.value.args)
    assert caught.value.__cause__ is not None


def test_an_unreachable_server_is_a_config_error_without_the_password():
    port = _closed_port()
    with pytest.raises(ConfigError) as caught:
        PostgresRagStore(f"postgresql://app:s3cr3t@127.0.0.1:{port}/rag", connect_timeout=2)
    message = str(caught.value)
    assert f"postgresql://***@127.0.0.1:{port}/rag" in message and "s3cr3t" not in message
    assert "server runs" in message and DSN_ENV in message
    assert caught.value.__cause__ is not None  # the driver's error is chained


def test_the_dsn_comes_from_the_environment_or_is_asked_for(monkeypatch, dsn, table):
    monkeypatch.delenv(DSN_ENV, raising=False)
    with pytest.raises(ConfigError, match=DSN_ENV):
        PostgresRagStore()
    monkeypatch.setenv(DSN_ENV, dsn)
    with PostgresRagStore(table=table) as store:
        assert store.dsn == dsn
        assert store.add_chunks("s", ["from the environment"]) == 1


def test_missing_psycopg_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes `import psycopg` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install 'streamengine\[postgres\]'") as caught:
        PostgresRagStore("postgresql://app@127.0.0.1/rag")
    assert isinstance(caught.value.__cause__, ImportError)


@pytest.mark.parametrize("kwargs", [
    {"table": "Bad-Name"}, {"table": "x; DROP TABLE y"}, {"table": "t" * 48}, {"table": ""},
    {"pool_size": 0}, {"pool_size": True}, {"pool_size": 2.5},
])
def test_bad_arguments_are_refused_before_connecting(kwargs):
    with pytest.raises(ConfigError):
        PostgresRagStore(f"postgresql://app@127.0.0.1:{_closed_port()}/rag", **kwargs)


def test_a_server_error_mid_run_names_the_store_and_what_failed(dsn, table):
    store = PostgresRagStore(dsn, table=table)
    try:
        store.add_chunks("s", ["the quokka"])
        drop_tables(dsn, [table])  # the table vanishes under the running store
        with pytest.raises(StreamEngineError, match="could not search") as caught:
            store.search("quokka")
        assert store.safe_dsn in str(caught.value) and caught.value.__cause__ is not None
        with pytest.raises(StreamEngineError, match=r"could not store 1 chunk\(s\) of 's'"):
            store.add_chunks("s", ["again"])
    finally:
        store.close()


# ---------------------------------------------------------------------------
# Schema, pool, vector path
# ---------------------------------------------------------------------------


def test_six_stores_opening_a_new_table_at_once_all_succeed(dsn, table):
    barrier = threading.Barrier(6)
    stores, errors = [], []

    def open_one():
        try:
            barrier.wait(timeout=10)
            stores.append(PostgresRagStore(dsn, table=table, pool_size=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, name=f"open-{n}") for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert errors == [] and len(stores) == 6
        for n, store in enumerate(stores):
            store.add_chunks(f"s{n}", [f"written by store{n}"])
        assert stores[0].count() == 6 and stores[5].search("store0", k=1)[0].source == "s0"
    finally:
        for store in stores:
            store.close()


def test_the_pool_is_bounded_and_the_vector_path_is_reported(dsn, table):
    with PostgresRagStore(dsn, table=table, pool_size=3, embedder=HashingEmbedder(), _force_no_pgvector=True) as store:
        assert store._pool.max_size == 3
        assert store.uses_pgvector is False and "float8[]" in repr(store)
        store.add_chunks("s", ["gamma rays"])
        assert store.search("gamma", k=1)[0].score == pytest.approx(2 / 61)


def test_pgvector_ranks_like_the_array_path_where_the_server_has_it(dsn, table):
    import psycopg

    with psycopg.connect(dsn) as conn:
        available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    if not available:
        pytest.skip("this server has no pgvector (Debian 12 packages none): the float8[] path ran instead")
    docs = {f"d{n}": f"word{n} word{n % 3} word{n % 5} common" for n in range(30)}
    with PostgresRagStore(dsn, table=table, embedder=HashingEmbedder(64)) as with_pgvector, \
            PostgresRagStore(dsn, table=table, embedder=HashingEmbedder(64), _force_no_pgvector=True) as arrays:
        assert with_pgvector.uses_pgvector
        for source, text in docs.items():
            with_pgvector.add_chunks(source, [text])
        query = "word1 word2 common"
        assert [(h.source, round(h.score, 9)) for h in with_pgvector.search(query, k=10)] == \
            [(h.source, round(h.score, 9)) for h in arrays.search(query, k=10)]


# ---------------------------------------------------------------------------
# Two engines in two processes, one store
# ---------------------------------------------------------------------------

#: Where rag_stores.py lives, for the child process's sys.path.
SUPPORT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")

FILING_PROCESS = """
import json, sys
sys.path.insert(0, {tests_dir!r})
from rag_stores import open_store
from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
from streamengine.testing import FakeProvider, steps as s

@tool
def fetch_page(url: str) -> str:
    \"\"\"Fetch a page.\"\"\"
    filler = " ".join(f"word{{i}}" for i in range(400))
    return f"{{filler}}. Field notes: {phrase}. {{filler}}"

store = open_store(json.loads(sys.argv[1]))
with FakeProvider() as fp:
    fp.add_turn(s.text('Fetching. <tool name="fetch_page">{{"url": "https://x"}}</tool>'))
    fp.add_turn(s.text("Fetched."))
    engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [fetch_page], EngineConfig(models=["m"]), rag=store)
    with engine:
        result = engine.complete([{{"role": "user", "content": "fetch it"}}], conversation_id="shared")
store.close()
print(json.dumps({{"answer": result.answer, "call_id": result.tool_results[0].call_id}}))
"""


def test_a_result_filed_by_an_engine_in_one_process_is_found_by_rag_search_in_another(dsn, table):
    spec = {"kind": "postgres", "dsn": dsn, "table": table}
    store = open_store(spec)  # this process's store; also creates the table before the other starts
    script = FILING_PROCESS.format(tests_dir=SUPPORT_DIR, phrase=PHRASE)
    other = subprocess.Popen([sys.executable, "-c", script, json.dumps(spec)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    filed = threading.Event()
    outcome = {}

    def await_other():
        outcome["out"], outcome["err"] = other.communicate(timeout=60)
        filed.set()

    watcher = threading.Thread(target=await_other, name="await-filing-process")
    watcher.start()
    try:
        with FakeProvider() as fp:
            # This engine is mid-answer while the other process files its tool result.
            fp.add_turn(s.text("Let me check what was fetched. "), s.wait(filed, timeout=60),
                        s.text('<tool name="rag_search">{"query": "where do herons nest", "k": 2}</tool>'))
            fp.add_turn(s.text("Herons nest by quartzite cliffs."))
            engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [], EngineConfig(models=["m"]), rag=store)
            with engine:
                # The same conversation in both processes: the scope both file into and search.
                result = engine.complete([{"role": "user", "content": "where do herons nest?"}],
                                         conversation_id="shared")
    finally:
        watcher.join(timeout=70)
        store.close()
    assert other.returncode == 0, outcome.get("err")
    filing = json.loads(outcome["out"])
    assert filing["answer"] == "Fetched."
    search = result.tool_results[0]
    assert search.name == "rag_search" and search.ok
    assert PHRASE in search.text and f"tool:fetch_page:{filing['call_id']}" in search.text


# ---------------------------------------------------------------------------
# Scopes on a table from before them; every wait bounded
# ---------------------------------------------------------------------------


def test_a_table_from_before_scopes_gets_the_column_and_its_rows_are_seen_by_no_run(dsn, table):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                     f"source text NOT NULL, text text NOT NULL, tsv tsvector GENERATED ALWAYS AS "
                     f"(to_tsvector('english', text)) STORED, embed_model text, vector float8[])")
        conn.execute(f"INSERT INTO {table} (source, text) VALUES ('tool:mail:1', 'the PIN is 4711 SECRET')")
    store = PostgresRagStore(dsn, table=table)
    try:
        assert [h.source for h in store.search("PIN SECRET")] == ["tool:mail:1"]  # scope ''
        assert store.search("PIN SECRET", scope="conversation:c-1") == []
        store.add_chunks("tool:mail:2", ["the PIN is 1234 SECRET"], scope="conversation:c-1")
        assert [h.source for h in store.search("PIN", scope="conversation:c-1")] == ["tool:mail:2"]
        with psycopg.connect(dsn) as conn:
            indexes = [row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s",
                                                      [table])]
        assert f"{table}_scope" in indexes
    finally:
        store.close()


def test_a_locked_table_fails_a_filing_within_the_statement_timeout(dsn, table):
    import psycopg

    store = PostgresRagStore(dsn, table=table, statement_timeout=0.5)
    locker = psycopg.connect(dsn)
    try:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # held until the rollback below
        with pytest.raises(StreamEngineError, match="could not store") as caught:
            store.add_chunks("s", ["blocked"], scope="x")
        assert "lock timeout" in str(caught.value) or "statement timeout" in str(caught.value)
        with pytest.raises(StreamEngineError, match="could not search"):
            store.search("blocked", scope="x")
    finally:
        locker.rollback()
        locker.close()
        store.close()


def test_runs_on_a_locked_table_never_hold_a_tool_worker_and_each_filing_counts_once(dsn, table):
    """The finding: 12 runs on a locked table held all 8 workers and a new run's tool never ran."""
    import psycopg

    from streamengine import DoneEvent, ToolStartEvent, tool

    @tool
    def fetch(n: int) -> str:
        """Fetches."""
        return f"page {n} about herons"

    store = PostgresRagStore(dsn, table=table, statement_timeout=0.3)
    locker = psycopg.connect(dsn)
    try:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        with FakeProvider() as fp:
            fp.respond_with(lambda request: [s.text('<tool name="fetch">{"n": 1}</tool>')]
                            if request["messages"][-1]["content"] == "go" else [s.text("done")])
            engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [fetch],
                                     EngineConfig(models=["m"], pool_size=8, filing_timeout=0.5,
                                                  max_continuations=1), rag=store)
            with engine:
                runs = []
                threads = [threading.Thread(target=lambda: runs.append(list(engine.run(
                    [{"role": "user", "content": "go"}])))) for _ in range(12)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
                started = threading.Event()
                late = [e for e in engine.run([{"role": "user", "content": "go"}])
                        if not (isinstance(e, ToolStartEvent) and started.set())]
                assert started.is_set() and engine.executor.stuck_workers() == 0
    finally:
        locker.rollback()
        locker.close()
        store.close()
    assert len(runs) == 12
    for events in runs + [late]:
        result = events[-1].result
        assert isinstance(events[-1], DoneEvent) and result.answer == "done"
        assert result.telemetry.filing_errors == 1 and result.telemetry.tools_ok == 1


class _CuttableProxy:
    """A TCP forwarder to the test server; ``cut()`` makes the server look down (refused, connections dead)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets = []
        self._threads = [threading.Thread(target=self._accept, name="pg-proxy-accept")]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                pump = threading.Thread(target=self._pump, args=(src, dst), name="pg-proxy-pump")
                self._threads.append(pump)
                pump.start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone would not on Linux
        except OSError:
            pass
        self._listener.close()
        for sock in list(self._sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(5)


def test_a_server_gone_down_is_a_bounded_filing_error_and_tools_keep_running(dsn, table):
    """The finding: with PostgreSQL down each add_chunks held its tool worker for the pool's 30 s."""
    import psycopg

    from streamengine import tool

    @tool
    def fetch() -> str:
        """Fetches."""
        return "a page about herons"

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    PostgresRagStore(dsn, table=table).close()  # the table exists before the proxy goes down
    proxy = _CuttableProxy(info.get("host", "127.0.0.1"), int(info.get("port", 5432)))
    store = PostgresRagStore(psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port)),
                             table=table, connect_timeout=1.0, statement_timeout=1.0)
    try:
        proxy.cut()
        with FakeProvider() as fp:
            fp.add_turn(s.text('<tool name="fetch">{}</tool> <tool name="rag_search">{"query": "herons"}</tool>'))
            fp.add_turn(s.text("done"))
            engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [fetch],
                                     EngineConfig(models=["m"], filing_timeout=5, tool_timeout=10), rag=store)
            with engine:
                result = engine.complete([{"role": "user", "content": "go"}])
                assert engine.executor.stuck_workers() == 0
    finally:
        proxy.cut()
        store.close()
    fetched, search = result.tool_results
    assert fetched.ok and not search.ok and "could not search" in search.error
    assert not search.timed_out  # bounded by connect_timeout, well inside the tool's deadline
    assert result.answer == "done" and result.telemetry.filing_errors == 1
