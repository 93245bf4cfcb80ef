"""Tool results become searchable in the same request: engine + SqliteRagStore + FakeProvider."""
from __future__ import annotations

import json
import threading

import pytest

from streamengine import (
    ConfigError,
    EngineConfig,
    OpenAICompatibleClient,
    OpenAIEmbedder,
    SqliteRagStore,
    StreamingEngine,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

PHRASE = "the heron nests beside quartzite cliffs"


def block(name, args=None):
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


@tool
def fetch_page(url: str) -> str:
    """Fetch a page."""
    filler = " ".join(f"word{i}" for i in range(400))
    return f"{filler}. Field notes: {PHRASE}. {filler}"


def engine_for(fp, store, **config):
    config.setdefault("models", ["m"])
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), [fetch_page], EngineConfig(**config), rag=store)


def test_round_two_search_finds_what_round_one_fetched():
    with FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.text("Fetching. " + block("fetch_page", {"url": "https://x"})))
        fp.add_turn(s.text("Let me look closer. " + block("rag_search", {"query": "heron quartzite", "k": 2})))
        fp.add_turn(s.text("Herons nest by quartzite cliffs."))
        with engine_for(fp, store) as engine:
            result = engine.complete([{"role": "user", "content": "where do herons nest?"}])
        assert [r.name for r in result.tool_results] == ["fetch_page", "rag_search"]
        search = result.tool_results[1]
        assert search.ok and PHRASE in search.text and "tool:fetch_page:" in search.text
        # The model saw the hit in its third request.
        assert PHRASE in fp.requests[2].json["messages"][-1]["content"]
        # rag_search results are not filed again; the fetched page is, in chunks.
        assert store.count() == store.count(source=f"tool:fetch_page:{result.tool_results[0].call_id}") > 1
    assert "rag_search" in [t["function"]["name"] for t in fp.requests[0].json["tools"]]


def test_search_in_the_same_round_finds_a_result_ingested_mid_stream():
    @tool
    def fetch_fast(topic: str) -> str:
        """Fetch."""
        return f"notes on {topic}: {PHRASE}"

    ingested = threading.Event()

    class SignallingStore(SqliteRagStore):
        def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
            n = super().add_chunks(source, chunks, embed_model, scope=scope)
            ingested.set()
            return n

    with FakeProvider() as fp, SignallingStore() as store:
        # The search block is only sent once the first tool's result is in the store.
        fp.add_turn(s.text(block("fetch_fast", {"topic": "herons"})), s.wait(ingested, timeout=5),
                    s.text(block("rag_search", {"query": "quartzite heron"})))
        fp.add_turn(s.text("done"))
        engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [fetch_fast],
                                 EngineConfig(models=["m"]), rag=store)
        with engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert ingested.is_set()
    assert PHRASE in result.tool_results[1].text


def test_failed_embeddings_still_store_the_text_and_the_run_succeeds():
    with FakeProvider(embedding_dim=16) as fp:
        client = OpenAICompatibleClient(fp.base_url)
        store = SqliteRagStore(embedder=OpenAIEmbedder(client, "embed-model"))
        fp.fail_embeddings(status=500, times=1)
        fp.add_turn(s.text(block("fetch_page", {"url": "u"})))
        fp.add_turn(s.text(block("rag_search", {"query": "heron quartzite"})))
        fp.add_turn(s.text("ok"))
        with engine_for(fp, store, embed_model="embed-model") as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
        store.close()
    assert result.answer == "ok"
    assert PHRASE in result.tool_results[1].text
    assert any(r.path.endswith("/embeddings") for r in fp.requests)


def test_ingestion_can_be_switched_off():
    with FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.text(block("fetch_page", {"url": "u"})))
        fp.add_turn(s.text("ok"))
        with engine_for(fp, store, ingest_tool_results=False) as engine:
            engine.complete([{"role": "user", "content": "q"}])
        assert store.count() == 0


def test_a_result_larger_than_max_filing_bytes_is_not_filed_and_the_setting_is_named():
    with FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.text(block("fetch_page", {"url": "u"})))
        fp.add_turn(s.text("ok"))
        with engine_for(fp, store, max_filing_bytes=1000) as engine:
            events = list(engine.run([{"role": "user", "content": "q"}]))
        errors = [e.message for e in events if e.name == "error"]
        assert store.count() == 0
        assert any("was not filed" in m and "EngineConfig.max_filing_bytes" in m for m in errors), errors
        assert events[-1].result.telemetry.filing_errors == 1


def test_max_filing_bytes_is_checked_like_every_count():
    with pytest.raises(ConfigError, match="max_filing_bytes"):
        EngineConfig(models=["m"], max_filing_bytes=0)
