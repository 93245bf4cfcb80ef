"""streamengine.rag: chunking, embedders, and what is SQLite's own (files, FTS5 fallback).

The store contract every store keeps is in test_rag_contract.py."""
from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest
from rag_stores import fill, warnings_log  # noqa: F401 - a fixture

from streamengine import ConfigError, LlmProtocolError
from streamengine.rag import Embedder, HashingEmbedder, OpenAIEmbedder, SqliteRagStore, chunks_for_ingest
from streamengine.rag import _base as rag_base
from streamengine.rag import _sqlite as rag


@pytest.fixture(autouse=True)
def no_thread_leaks():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            return
        for thread in extra:
            thread.join(timeout=0.05)
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []




# ---------------------------------------------------------------------------
# chunks_for_ingest
# ---------------------------------------------------------------------------


def _random_text(rng: random.Random, unique: bool) -> str:
    """Prose with paragraphs, sentences, line breaks and the odd huge word."""
    vocabulary = ["the", "a", "tool", "result", "of", "search", "data", "x", "model", "stream"]
    paragraphs = []
    counter = 0
    for _ in range(rng.randint(1, 6)):
        sentences = []
        for _ in range(rng.randint(1, 8)):
            words = []
            for _ in range(rng.randint(1, 25)):
                counter += 1
                roll = rng.random()
                # a word of 60-200 letters is longer than the chunk sizes used
                word = "H" * rng.randint(60, 200) if roll < 0.02 else rng.choice(vocabulary) * rng.randint(1, 3)
                words.append(f"{word}{counter}" if unique else word)
            sentences.append(" ".join(words) + rng.choice([".", "!", "?", ",", ""]))
        paragraphs.append(rng.choice([" ", "  ", "\n", " \t"]).join(sentences))
    return rng.choice(["", "  ", "\n"]) + rng.choice(["\n\n", "\n \n", "\n\n\n"]).join(paragraphs) + "\n "


def _covers_in_order(text: str, chunks: list, overlap: int) -> bool:
    """Whether dropping some overlap prefix from each chunk leaves exactly the words of ``text``.

    Words may repeat, so the overlap length is not unique; search over every
    admissible choice (a prefix of a chunk that is a suffix of the previous
    chunk, at most ``overlap`` characters long there) with a set of reachable
    positions in the input's word list.
    """
    words = text.split()
    reachable = {0}
    previous = None
    for chunk in chunks:
        chunk_words = chunk.split()
        nxt = set()
        for position in reachable:
            for cut in range(len(chunk_words) + 1):
                if cut and (previous is None or chunk_words[:cut] != previous[-cut:]):
                    continue
                if cut and len(" ".join(previous[-cut:])) > overlap:
                    continue
                rest = chunk_words[cut:]
                if rest and words[position:position + len(rest)] == rest:
                    nxt.add(position + len(rest))
        reachable = nxt
        previous = chunk_words
    return len(words) in reachable


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("size,overlap", [(40, 0), (50, 10), (80, 30), (120, 119)])
def test_chunks_lose_no_text_and_respect_size(seed, size, overlap):
    text = _random_text(random.Random(seed), unique=seed % 2 == 0)
    chunks = chunks_for_ingest(text, chunk_size=size, overlap=overlap)
    assert chunks and all(chunk.strip() == chunk and chunk for chunk in chunks)
    for chunk in chunks:
        assert chunk in text  # a verbatim slice of the input
        assert len(chunk) <= size or (len(chunk.split()) == 1 and len(chunk) > size)
    assert _covers_in_order(text, chunks, overlap)
    assert chunks_for_ingest(text, chunk_size=size, overlap=overlap) == chunks  # deterministic


def test_overlap_is_whole_words_from_the_end_of_the_previous_chunk():
    text = " ".join(f"w{i:03d}" for i in range(200))  # unique words: the overlap is unambiguous
    chunks = chunks_for_ingest(text, chunk_size=60, overlap=20)
    seen = set()
    for previous, chunk in zip(chunks, chunks[1:]):
        seen.update(previous.split())
        shared = [w for w in chunk.split() if w in seen]
        assert shared, "every chunk after the first should carry some overlap here"
        tail = " ".join(shared)
        assert previous.endswith(tail) and chunk.startswith(tail)
        assert len(tail) <= 20
    assert chunks[0].startswith("w000 ") and chunks[-1].endswith(" w199")


def test_a_word_longer_than_chunk_size_is_its_own_uncut_chunk():
    huge = "https://example.com/" + "z" * 300
    chunks = chunks_for_ingest(f"before the link {huge} after the link", chunk_size=50, overlap=10)
    assert huge in chunks
    index = chunks.index(huge)
    assert index > 0 and "after" in chunks[index + 1] and huge not in chunks[index + 1]


def test_paragraphs_are_preferred_to_sentences():
    paragraphs = [" ".join([f"para{p} sentence{s}." for s in range(4)]) for p in range(6)]
    text = "\n\n".join(paragraphs)
    size = len(paragraphs[0]) * 2 + 10  # two paragraphs fit, three do not
    chunks = chunks_for_ingest(text, chunk_size=size, overlap=0)
    assert len(chunks) == 3
    for chunk in chunks:
        assert all(part in paragraphs for part in chunk.split("\n\n"))


def test_a_big_paragraph_is_split_at_sentences_and_kept_apart_from_neighbours():
    sentences = [f"Sentence number {i} is here." for i in range(12)]
    big = " ".join(sentences)
    text = "Small intro.\n\n" + big + "\n\nSmall outro."
    chunks = chunks_for_ingest(text, chunk_size=90, overlap=0)
    assert chunks[0] == "Small intro." and chunks[-1] == "Small outro."
    for chunk in chunks[1:-1]:
        assert chunk.endswith(".") and chunk.startswith("Sentence")


def test_small_empty_and_whitespace_text():
    assert chunks_for_ingest("  hello world \n") == ["hello world"]
    assert chunks_for_ingest("") == []
    assert chunks_for_ingest(" \n\t \n ") == []


@pytest.mark.parametrize("kwargs", [
    {"chunk_size": 0}, {"chunk_size": -5}, {"chunk_size": 10, "overlap": 10},
    {"chunk_size": 10, "overlap": -1}, {"chunk_size": 10.5}, {"chunk_size": True}, {"overlap": None},
])
def test_chunk_arguments_are_validated(kwargs):
    with pytest.raises(ConfigError):
        chunks_for_ingest("some text", **kwargs)
    with pytest.raises(ConfigError):
        chunks_for_ingest(b"bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# SqliteRagStore: keyword search
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# Embedders and fusion
# ---------------------------------------------------------------------------


def test_hashing_embedder_is_deterministic_and_unit_length():
    embedder = HashingEmbedder(dim=32)
    assert isinstance(embedder, Embedder) and embedder.model == "hashing-32"
    first, again, empty = embedder.embed(["Tool results, tool RESULTS!", "tool results", " ... "], None)
    assert first == again  # case and punctuation do not matter, only words
    assert len(first) == 32 and abs(sum(x * x for x in first) - 1.0) < 1e-9
    assert empty == [0.0] * 32
    # Stable across processes: BLAKE2b, not the salted hash().
    code = "from streamengine.rag import HashingEmbedder; print(HashingEmbedder(32).embed(['tool results'], None)[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(first)
    with pytest.raises(ConfigError):
        HashingEmbedder(0)


class _FakeClient:
    def __init__(self, short_by=0):
        self.calls = []
        self.short_by = short_by

    def embed(self, texts, model):
        self.calls.append((list(texts), model))
        return [[float(len(t)), 1.0] for t in texts][: len(texts) - self.short_by]


def test_openai_embedder_batches_in_order():
    client = _FakeClient()
    embedder = OpenAIEmbedder(client, "text-embedding-3-small", batch_size=64)
    texts = ["t" * i for i in range(150)]
    vectors = embedder.embed(texts, None)
    assert [len(batch) for batch, _ in client.calls] == [64, 64, 22]
    assert {model for _, model in client.calls} == {"text-embedding-3-small"}
    assert [v[0] for v in vectors] == [float(i) for i in range(150)]
    embedder.embed(["x"], "other-model")
    assert client.calls[-1][1] == "other-model"
    with pytest.raises(LlmProtocolError):
        OpenAIEmbedder(_FakeClient(short_by=1), "m").embed(["a", "b"], None)
    for bad in ({"client": object(), "model": "m"}, {"client": client, "model": ""},
                {"client": client, "model": "m", "batch_size": 0}):
        with pytest.raises(ConfigError):
            OpenAIEmbedder(**bad)


# ---------------------------------------------------------------------------
# Persistence, threads, FTS5 fallback
# ---------------------------------------------------------------------------


def test_a_file_store_persists_across_instances_and_processes(tmp_path):
    path = tmp_path / "rag.sqlite"
    with SqliteRagStore(path, embedder=HashingEmbedder()) as first:
        first.add_chunks("tool:a:1", ["the quokka smiles for photos", "unrelated filler text"])
    code = (
        "import sys; from streamengine.rag import SqliteRagStore, HashingEmbedder\n"
        "s = SqliteRagStore(sys.argv[1], embedder=HashingEmbedder())\n"
        "s.add_chunks('tool:b:2', ['a wombat digs burrows at night']); s.close()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=30)
    with SqliteRagStore(str(path), embedder=HashingEmbedder()) as second:
        assert second.count() == 3
        assert second.search("quokka", k=1)[0].source == "tool:a:1"
        assert second.search("wombat burrows", k=1)[0].source == "tool:b:2"
        # the stored vectors are used: the fused score of a top hit in both lists
        assert second.search("wombat burrows", k=1)[0].score == pytest.approx(2 / (rag_base.RRF_K + 1))


def test_missing_fts5_falls_back_to_like_with_a_warning(monkeypatch, warnings_log):
    monkeypatch.setattr(rag, "_fts5_available", lambda: False)
    with fill(SqliteRagStore()) as store:
        assert store.uses_fts is False
        assert any("FTS5" in r["message"] for r in warnings_log)
        assert store.search("quokka", k=1)[0].source == "doc:rare"
        assert store.search("dogs", k=5, source="doc:mix")[0].source == "doc:mix"
        # LIKE matches substrings; only whole words count
        assert store.search("quo") == []


def test_rows_added_without_fts5_are_indexed_when_reopened_with_it(tmp_path, monkeypatch):
    path = str(tmp_path / "mixed.sqlite")
    with SqliteRagStore(path) as store:
        store.add_chunks("with-fts", ["the quokka"])
    with SqliteRagStore(path, _force_no_fts=True) as store:
        store.add_chunks("without-fts", ["the wombat"])
        assert store.search("wombat", k=1)[0].source == "without-fts"
    with SqliteRagStore(path) as store:
        assert store.uses_fts
        assert store.search("wombat", k=1)[0].source == "without-fts"
        assert store.search("quokka", k=1)[0].source == "with-fts"


def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path):
    path = tmp_path / "not.sqlite"
    path.write_bytes(b"this is not an sqlite file" * 100)
    with pytest.raises(ConfigError, match="RAG store"):
        SqliteRagStore(path)
    with pytest.raises(ConfigError):
        SqliteRagStore(embedder=object())  # type: ignore[arg-type]


def test_a_store_from_a_newer_version_is_refused(tmp_path):
    import sqlite3

    path = str(tmp_path / "future.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        SqliteRagStore(path)


# ---------------------------------------------------------------------------
# Real HTTP: the client's embed() against FakeProvider's /v1/embeddings
# ---------------------------------------------------------------------------


def _fake_provider():
    from streamengine import OpenAICompatibleClient
    from streamengine.testing import FakeProvider

    return FakeProvider, OpenAICompatibleClient


def test_openai_embedder_through_fake_provider_and_a_500(warnings_log):
    FakeProvider, Client = _fake_provider()
    with FakeProvider(embedding_dim=16) as fp:
        client = Client(fp.base_url, api_key="test-key")
        try:
            embedder = OpenAIEmbedder(client, "embed-small", batch_size=2)
            with SqliteRagStore(embedder=embedder) as store:
                assert store.add_chunks("tool:a:1", ["alpha one", "beta two", "gamma three"]) == 3
                fp.fail_embeddings(status=500, times=1)
                assert store.add_chunks("tool:b:2", ["the zanzibar phrase"]) == 1
                assert any("without vectors" in r["message"] for r in warnings_log)
                assert store.search("zanzibar", k=1)[0].source == "tool:b:2"
                assert store.search("gamma three", k=1)[0].source == "tool:a:1"
        finally:
            client.close()
