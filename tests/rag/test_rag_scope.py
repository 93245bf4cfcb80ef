"""Scoped retrieval: one user's filed tool results never answer another user's ``rag_search``.

Through the served app (real waitress, real HTTP, FakeProvider), through the
engine (``conversation_id``), and in each store (SQLite here, PostgreSQL in
test_rag_postgres.py), including a store made before scopes existed.
"""
from __future__ import annotations

import json
import sqlite3

import pytest
import requests
from rag_stores import stores  # noqa: F401 - a fixture: one StoreMaker per store kind
from serve_support import served

from streamengine import ConfigError, EngineConfig, OpenAICompatibleClient, SqliteRagStore, StreamingEngine, tool
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

SECRET = "bank PIN is 4711, reset link carries SECRET-TOKEN"


@tool
def read_mail() -> str:
    """Reads the user's mail."""
    return SECRET


def block(name, args=None):
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


def search_turn(fp):
    fp.add_turn(s.text(block("rag_search", {"query": "bank PIN reset link"})))
    fp.add_turn(s.text("ok"))


def last_continuation(fp) -> str:
    return fp.requests[-1].json["messages"][-1]["content"]


def engine_for(fp, store):
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), [read_mail], EngineConfig(models=["m"]), rag=store)


def test_over_http_bob_never_finds_what_alices_run_filed():
    with FakeProvider() as fp, SqliteRagStore() as store, engine_for(fp, store) as engine:
        def scope(environ):  # the application names the scope (here from its own session header); the body cannot
            return "user:" + environ["HTTP_X_SESSION_USER"]

        with served(engine, scope=scope) as url:
            def ask(user, body=None):
                resp = requests.post(url + "v1/chat/stream", timeout=20, headers={"X-Session-User": user},
                                     json=body or {"messages": [{"role": "user", "content": "mail?"}]})
                assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
                return resp.text

            fp.add_turn(s.text(block("read_mail")))
            fp.add_turn(s.text("read"))
            ask("alice")
            search_turn(fp)
            # Bob's body even names Alice's conversation: the scope comes from the app, not the request.
            ask("bob", {"messages": [{"role": "user", "content": "PIN?"}], "conversation_id": "user:alice"})
            assert "SECRET-TOKEN" not in last_continuation(fp)
            assert "no stored text matches" in last_continuation(fp)
            search_turn(fp)
            ask("alice")
            assert "SECRET-TOKEN" in last_continuation(fp)


def test_runs_without_a_conversation_id_are_each_their_own_scope(stores):
    store = stores.new()
    with FakeProvider() as fp, engine_for(fp, store) as engine:
        fp.add_turn(s.text(block("read_mail")))
        fp.add_turn(s.text("read"))
        engine.complete([{"role": "user", "content": "mail?"}])
        search_turn(fp)
        later = engine.complete([{"role": "user", "content": "PIN?"}])
        assert later.tool_results[0].ok and "no stored text matches" in later.tool_results[0].text
        # The same conversation_id shares: the second run finds what the first filed.
        fp.add_turn(s.text(block("read_mail")))
        fp.add_turn(s.text("read"))
        engine.complete([{"role": "user", "content": "mail?"}], conversation_id="c-1")
        search_turn(fp)
        again = engine.complete([{"role": "user", "content": "PIN?"}], conversation_id="c-1")
        assert "SECRET-TOKEN" in again.tool_results[0].text
        assert store.count() == 2  # both filings are there; only the scope decides who sees them


def test_a_conversation_id_must_be_a_name():
    with FakeProvider() as fp, SqliteRagStore() as store, engine_for(fp, store) as engine, \
            pytest.raises(ConfigError, match="conversation_id"):
        engine.run([{"role": "user", "content": "q"}], conversation_id="  ")


def test_the_store_filters_by_scope_in_the_query_itself():
    with SqliteRagStore() as store:
        store.add_chunks("tool:a:1", [SECRET], scope="tenant:a")
        store.add_chunks("tool:b:1", ["bank holidays list"], scope="tenant:b")
        assert [h.source for h in store.search("bank PIN", scope="tenant:a")] == ["tool:a:1"]
        assert [h.source for h in store.search("bank PIN", scope="tenant:b")] == ["tool:b:1"]
        assert store.search("bank PIN") == []  # the unscoped '' sees neither
        with pytest.raises(ConfigError, match="scope"):
            store.search("bank", scope=None)
        plan = " ".join(str(row) for row in store._conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM chunks WHERE scope = ? AND source = ?", ("a", "b")))
        assert "chunks_by_scope" in plan or "chunks_by_source" in plan


def test_without_fts_the_like_path_is_scoped_too():
    with SqliteRagStore(_force_no_fts=True) as store:
        store.add_chunks("tool:a:1", [SECRET], scope="tenant:a")
        assert store.search("SECRET", scope="tenant:b") == []
        assert store.search("SECRET", scope="tenant:a")[0].source == "tool:a:1"


def test_a_store_from_before_scopes_is_migrated_and_its_rows_seen_by_no_run(tmp_path):
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE chunks (id INTEGER PRIMARY KEY, source TEXT NOT NULL, text TEXT NOT NULL, "
                 "embed_model TEXT, vector BLOB)")
    conn.execute("INSERT INTO chunks(source, text) VALUES ('tool:read_mail:call_1', ?)", (SECRET,))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with SqliteRagStore(path) as store:
        assert store.count() == 1
        assert store.search("SECRET")[0].source == "tool:read_mail:call_1"  # scope '' for the old rows
        with FakeProvider() as fp, engine_for(fp, store) as engine:
            search_turn(fp)
            result = engine.complete([{"role": "user", "content": "PIN?"}], conversation_id="c-1")
        assert "SECRET-TOKEN" not in result.tool_results[0].text
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2


def test_the_tool_description_says_what_it_searches():
    with FakeProvider() as fp, SqliteRagStore() as store, engine_for(fp, store) as engine:
        spec = next(spec for spec in engine.registry.specs() if spec.name == "rag_search")
        assert "this conversation" in spec.description


def test_each_run_gets_a_copy_of_one_template_and_an_applications_own_rag_search_runs_as_is():
    with FakeProvider() as fp, SqliteRagStore() as store, engine_for(fp, store) as engine:
        template = engine.registry.get("rag_search")
        bound = engine._scoped_tools("conversation:x")["rag_search"]
        assert bound is not template and bound.spec == template.spec
        assert bound._signature is template._signature  # the schema is built once per engine, not per run

    @tool(name="rag_search")
    def own_search(query: str) -> str:
        """The application's own search."""
        return f"own answer to {query}"

    with FakeProvider() as fp, SqliteRagStore() as store:
        engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [read_mail, own_search],
                                 EngineConfig(models=["m"]), rag=store)
        with engine:
            fp.add_turn(s.text(block("rag_search", {"query": "pins"})))
            fp.add_turn(s.text("ok"))
            result = engine.complete([{"role": "user", "content": "q"}])
    assert result.tool_results[0].text == "own answer to pins"
