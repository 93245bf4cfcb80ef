"""The RagStore contract, held by every store: SQLite (FTS5 and its LIKE fallback) and PostgreSQL.

Same query meaning everywhere: any query word may match, rarer words and
more occurrences rank higher, query syntax is never interpreted, sources
scope a search, vectors fuse with keywords by RRF, writers never lose rows.
"""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from rag_stores import (  # noqa: F401 - stores and warnings_log are fixtures
    CORPUS,
    FUSION_DOCS,
    HOSTILE_QUERIES,
    STEMMING_KINDS,
    fill,
    spec_json,
    stores,
    warnings_log,
    writer_script,
)

from streamengine import ConfigError, StreamEngineError
from streamengine.rag import Filing, HashingEmbedder, Hit, RagStore
from streamengine.rag import _base as rag_base

pytestmark = pytest.mark.usefixtures("no_thread_leak")




# ---------------------------------------------------------------------------
# Scopes: a search sees only its own scope's rows
# ---------------------------------------------------------------------------


def test_a_search_sees_only_its_scope_whatever_it_asks(stores):
    store = stores.new(embedder=HashingEmbedder())
    store.add_chunks("tool:mail:a", ["alice: bank PIN is 4711, SECRET-TOKEN"], scope="conversation:alice")
    store.add_chunks("tool:mail:b", ["bob: bank holiday on monday"], scope="conversation:bob")
    store.add_chunks("tool:mail:old", ["old bank PIN row"])  # no scope: ''
    for scope, expected in [("conversation:alice", ["tool:mail:a"]), ("conversation:bob", ["tool:mail:b"]),
                            ("", ["tool:mail:old"]), ("conversation:carol", [])]:
        hits = store.search("bank PIN SECRET-TOKEN holiday", k=10, scope=scope)
        assert [h.source for h in hits] == expected, scope
    assert store.search("bank", k=10, source="tool:mail:a", scope="conversation:bob") == []
    with pytest.raises(ConfigError, match="scope"):
        store.add_chunks("s", ["x"], scope=None)


def test_many_filings_go_in_one_call_each_in_its_own_scope_with_one_embedding_call(stores):
    calls = []

    class CountingEmbedder(HashingEmbedder):
        def embed(self, texts, model=None):
            calls.append(len(texts))
            return super().embed(texts, model)

    store = stores.new(embedder=CountingEmbedder())
    counts = store.add_many([Filing("tool:mail:a", ["alice quokka notes", "second alice chunk"], "conversation:a"),
                             ("tool:mail:b", ["bob quokka notes"], "conversation:b"),
                             Filing("tool:mail:empty", ["  ", ""], "conversation:a")])
    assert counts == [2, 1, 0] and calls == [3]
    assert [h.source for h in store.search("quokka", k=5, scope="conversation:a")] == ["tool:mail:a"]
    assert [h.source for h in store.search("quokka", k=5, scope="conversation:b")] == ["tool:mail:b"]
    assert store.add_many([]) == []


def test_a_batch_with_one_bad_filing_stores_nothing(stores):
    store = stores.new()
    with pytest.raises(ConfigError, match="source"):
        store.add_many([Filing("tool:ok:1", ["fine words"], "s"), Filing("", ["no source"], "s")])
    assert store.count() == 0


# ---------------------------------------------------------------------------
# Keyword meaning
# ---------------------------------------------------------------------------


def test_the_document_with_the_rare_term_ranks_first(stores):
    store = fill(stores.new())
    hits = store.search("the day in the park with a quokka", k=3)
    assert hits[0].source == "doc:rare"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(isinstance(h, Hit) for h in hits) and len(hits) == 3
    assert store.search("zzzunknownzzz") == []


def test_more_occurrences_rank_higher_among_equal_documents(stores):
    store = stores.new()
    store.add_chunks("once", ["the wombat digs near rivers and forests every night"])
    store.add_chunks("thrice", ["the wombat digs and the wombat sleeps and the wombat eats"])
    store.add_chunks("none", ["the koala sleeps in eucalyptus trees most of the day"])
    assert [h.source for h in store.search("wombat", k=5)] == ["thrice", "once"]


def test_a_question_with_extra_words_still_finds_the_passage(stores):
    store = stores.new()
    store.add_chunks("tool:fetch:1", [f"filler paragraph number {i} about nothing much" for i in range(30)])
    store.add_chunks("tool:fetch:2", ["Field notes: the heron nests beside quartzite cliffs."])
    hits = store.search("Could you please tell me where exactly the herons nest these days?", k=3)
    assert hits[0].source == "tool:fetch:2"


def test_search_filters_by_source_and_validates_arguments(stores):
    store = fill(stores.new())
    hits = store.search("park day dogs", k=5, source="doc:park")
    assert [h.source for h in hits] == ["doc:park"]
    assert store.search("park", source="doc:none") == []
    for bad in (0, -1, 2.0, "5", True, None):
        with pytest.raises(ConfigError):
            store.search("park", k=bad)
    with pytest.raises(ConfigError):
        store.search(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.search("park", source="")
    assert store.search("   ") == []


@pytest.mark.parametrize("stores", STEMMING_KINDS, indirect=True)
def test_stemming_matches_word_forms(stores):
    store = fill(stores.new())
    assert store.search("barking dog", k=1)[0].source == "doc:dogs"


def test_hostile_queries_never_raise(stores):
    store = fill(stores.new(embedder=HashingEmbedder()))
    for query in HOSTILE_QUERIES:
        assert isinstance(store.search(query, k=3), list)
        assert isinstance(store.search(query, k=3, source=query if query.strip() else "s"), list)
    # Operators and column filters are plain words: "text:quokka" finds the quokka.
    assert store.search("text:quokka", k=1)[0].source == "doc:rare"
    assert store.search('"quokka AND (', k=1)[0].source == "doc:rare"
    assert store.search("quokka:* & !park", k=1)[0].source == "doc:rare"
    assert store.count() == len(CORPUS)  # nothing was dropped or changed


def test_odd_text_and_sources_are_stored_and_found(stores):
    store = stores.new()
    odd_source = "tool:fetch:'); DROP TABLE x; --"
    assert store.add_chunks(odd_source, ["a NUL\x00 inside the zebu paragraph", "🙂 émoji ünïcode yak"]) == 2
    assert store.search("zebu", k=1)[0].source == odd_source
    assert "émoji" in store.search("yak", k=1, source=odd_source)[0].text
    assert store.count(odd_source) == 2


def test_add_chunks_validates_and_skips_blank_chunks(stores):
    store = stores.new()
    assert isinstance(store, RagStore)
    assert store.add_chunks("s", ["one", "  ", "", "two"]) == 2
    assert store.add_chunks("s", []) == 0
    assert store.count() == 2 and store.count("s") == 2
    for bad_source in ("", None, 3):
        with pytest.raises(ConfigError):
            store.add_chunks(bad_source, ["x"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        store.add_chunks("s", "a whole string")
    with pytest.raises(ConfigError):
        store.add_chunks("s", ["ok", 3])  # type: ignore[list-item]
    assert store.count() == 2  # a refused call stored nothing


def test_closed_store_raises_a_clear_error_and_close_is_idempotent(stores):
    store = fill(stores.new())
    store.close()
    store.close()
    with pytest.raises(StreamEngineError, match="closed"):
        store.search("park")
    with pytest.raises(StreamEngineError, match="closed"):
        store.add_chunks("s", ["x"])


# ---------------------------------------------------------------------------
# Embeddings and fusion
# ---------------------------------------------------------------------------


def test_cosine_fused_with_keywords_surfaces_a_doc_keywords_rank_low(stores):
    # "beta" is in most documents, so keyword ranking gives it little weight
    # and x, which shares only "beta" with the query, falls behind every
    # "alpha" doc; its vector, though, is the closest to the query's.
    query = "alpha beta"
    plain = fill(stores.new(), FUSION_DOCS)
    fused = fill(stores.new(embedder=HashingEmbedder(256)), FUSION_DOCS)
    assert "x" not in [h.source for h in plain.search(query, k=2)]
    hits = fused.search(query, k=2)
    assert [h.source for h in hits] == ["r1", "x"]
    # r1: first by keywords, behind x by cosine; the score is the RRF sum
    assert 1 / (rag_base.RRF_K + 1) < hits[0].score <= 1 / (rag_base.RRF_K + 1) + 1 / (rag_base.RRF_K + 2)


def test_stored_vectors_are_used_by_another_instance(stores):
    first = stores.new(persistent=True, embedder=HashingEmbedder())
    first.add_chunks("tool:a:1", ["the quokka smiles for photos", "unrelated filler text"])
    second = stores.again(first, embedder=HashingEmbedder())
    second.add_chunks("tool:b:2", ["a wombat digs burrows at night"])
    # top of both the keyword and the cosine lists: the fused score of rank 1 twice
    assert first.search("wombat burrows", k=1)[0].score == pytest.approx(2 / (rag_base.RRF_K + 1))
    assert second.search("quokka", k=1)[0].source == "tool:a:1"


def test_the_source_filter_holds_for_the_vector_ranking_too(stores):
    store = fill(stores.new(embedder=HashingEmbedder(64)))
    hits = store.search("cats purr happy", k=5, source="doc:dogs")
    assert [h.source for h in hits] == ["doc:dogs"]  # found by cosine, filtered by source


def test_vectors_of_another_model_are_not_compared(stores):
    store = stores.new(embedder=HashingEmbedder(64), embed_model="model-a")
    store.add_chunks("a", ["beta beta beta"])
    store.add_chunks("b", ["beta beta beta"], embed_model="model-b")
    by_source = {h.source: h.score for h in store.search("gamma beta", k=5)}
    # both are keyword hits; only "a" also ranks in the vector list
    assert by_source["a"] > by_source["b"]


def test_vectors_of_another_dimension_are_skipped(stores):
    store = stores.new(persistent=True, embedder=HashingEmbedder(32), embed_model="same-label")
    store.add_chunks("small", ["gamma delta"])
    wider = stores.again(store, embedder=HashingEmbedder(48), embed_model="same-label")
    wider.add_chunks("wide", ["gamma delta"])
    by_source = {h.source: h.score for h in wider.search("gamma delta", k=5)}
    assert by_source["wide"] > by_source["small"]


class _BrokenEmbedder:
    model = "broken"

    def __init__(self, fail_ingest=True, fail_query=True, wrong_count=False):
        self.fail_ingest, self.fail_query, self.wrong_count = fail_ingest, fail_query, wrong_count

    def embed(self, texts, model):
        texts = list(texts)
        is_query = len(texts) == 1 and texts[0].startswith("?")
        if (self.fail_query if is_query else self.fail_ingest):
            raise ConnectionError("embedding endpoint answered 500")
        if self.wrong_count and not is_query:
            return [[1.0]]
        return HashingEmbedder(16).embed(texts, None)


@pytest.mark.parametrize("embedder", [
    _BrokenEmbedder(), _BrokenEmbedder(wrong_count=True, fail_ingest=False, fail_query=False),
])
def test_failed_embedding_still_stores_the_text(stores, embedder, warnings_log):
    store = stores.new(embedder=embedder)
    assert store.add_chunks("tool:fetch:1", ["the unique phrase zanzibar pineapple", "other text"]) == 2
    assert any("without vectors" in r["message"] for r in warnings_log)
    hits = store.search("? zanzibar", k=1)
    assert hits[0].source == "tool:fetch:1" and "zanzibar" in hits[0].text


def test_a_failed_query_embedding_falls_back_to_keywords(stores, warnings_log):
    store = stores.new(embedder=_BrokenEmbedder(fail_ingest=False))
    store.add_chunks("s", ["quokka island", "dog park"])
    hits = store.search("? quokka", k=2)
    assert [h.source for h in hits] == ["s"] and "quokka" in hits[0].text
    assert hits[0].score > 0 and any("BM25" in r["message"] for r in warnings_log)


def test_a_bad_embedder_is_a_config_error(stores):
    with pytest.raises(ConfigError, match="embed"):
        stores.new(embedder=object())


# ---------------------------------------------------------------------------
# Concurrency: threads and processes
# ---------------------------------------------------------------------------


def test_concurrent_add_and_search_from_eight_threads(stores):
    store = stores.new(embedder=HashingEmbedder())
    barrier = threading.Barrier(8)
    errors = []

    def work(n):
        try:
            barrier.wait(timeout=10)
            for i in range(15):
                store.add_chunks(f"tool:t{n}:{i}", [f"thread{n} item{i} shared words", f"second{n}x{i} chunk"])
                store.search(f"thread{(n + 1) % 8} shared", k=3)
                store.search("shared", k=2, source=f"tool:t{n}:{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), name=f"rag-{n}") for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert store.count() == 8 * 15 * 2
    for n in range(8):
        assert store.search(f"thread{n} item7", k=1)[0].source == f"tool:t{n}:7"


@pytest.mark.parametrize("stores", ["sqlite", "postgres"], indirect=True)
def test_writers_in_three_processes_lose_nothing(stores):
    store = stores.new(persistent=True, embedder=HashingEmbedder())
    procs = [subprocess.Popen([sys.executable, "-c", writer_script(), spec_json(store), str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(3)]
    try:
        for proc in procs:  # all opened the store: now they write at once
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and out.strip() == "done", err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert store.count() == 3 * 20 * 2
    for n in range(3):
        for i in (0, 19):
            assert store.search(f"process{n} item{i}", k=1)[0].source == f"proc{n}:{i}"
