"""Filing keeps up with a busy engine: 200 runs at once over real HTTP, each filing two tool results.

With one filing per store call behind a bound of 256 waiting filings, 200
concurrent served runs had about a quarter of their results refused ("256
filings are already waiting") although the store itself files thousands a
second: a moment of lock contention was enough to fill the queue.  Here the
store is held by another writer (another process's transaction, a
checkpoint) while all 400 results arrive: they wait, within the memory
bound, and are filed when the store is free, in a few transactions.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from typing import Any, Iterator

import pytest
from conftest import wait_for
from rag_stores import StoreMaker

from streamengine import DoneEvent, EngineConfig, OpenAICompatibleClient, StreamingEngine, ToolResultEvent, tool
from streamengine.rag import chunks_for_ingest
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

RUNS = 200
TOOLS_PER_RUN = 2


@tool
def fetch(n: int) -> str:
    """Fetch item n."""
    return f"item {n}: " + " ".join(f"word{i}" for i in range(150))


def answer(request: Any) -> Any:
    """Round one asks for two fetches (numbered after the run), round two answers."""
    messages = request["messages"]
    if len(messages) > 2:
        return [s.text("done.")]
    run = int(messages[-1]["content"].split()[-1])
    calls = [f'<tool name="fetch">{json.dumps({"n": run * 10 + k})}</tool>' for k in range(TOOLS_PER_RUN)]
    return [s.text("Fetching. "), *[s.text(call) for call in calls]]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    maker = StoreMaker(request.param, tmp_path)
    # A store call may wait for the other writer longer than by default, never fail for it.
    waits = {"busy_timeout": 30.0} if request.param == "sqlite" else {"statement_timeout": 30.0}
    yield maker.new(persistent=True, **waits)
    maker.cleanup()


@contextlib.contextmanager
def another_writer(store: Any) -> Iterator[None]:
    """Another connection holds the store's write lock until the block ends."""
    if hasattr(store, "path"):
        conn = sqlite3.connect(store.path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
    else:
        import psycopg

        conn = psycopg.connect(store.dsn)
        conn.execute(psycopg.sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(psycopg.sql.Identifier(store.table)))
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def test_two_hundred_concurrent_runs_file_every_result_through_a_busy_moment_of_the_store(store):
    results, told, lock = [None] * RUNS, [0], threading.Lock()
    config = EngineConfig(models=["m"], pool_size=64, max_tools_per_round=TOOLS_PER_RUN, filing_timeout=30.0)

    def run(engine: Any, i: int) -> None:
        for event in engine.run([{"role": "user", "content": f"fetch for run {i}"}]):
            if isinstance(event, ToolResultEvent):
                with lock:
                    told[0] += 1
            elif isinstance(event, DoneEvent):
                results[i] = event.result

    with FakeProvider() as fp:
        fp.respond_with(answer)
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [fetch], config, rag=store) as engine:
            threads = [threading.Thread(target=run, args=(engine, i), name=f"run-{i}") for i in range(RUNS)]
            with another_writer(store):
                for thread in threads:
                    thread.start()
                assert wait_for(lambda: told[0] == RUNS * TOOLS_PER_RUN, timeout=60)
            for thread in threads:
                thread.join(60)
    assert all(result is not None and result.answer.endswith("done.") for result in results)
    telemetry = [result.telemetry for result in results]
    assert sum(t.tools_ok for t in telemetry) == RUNS * TOOLS_PER_RUN
    assert sum(t.filing_errors for t in telemetry) == 0
    chunks = len(chunks_for_ingest(fetch(0), config.chunk_size, config.chunk_overlap))
    assert store.count() == RUNS * TOOLS_PER_RUN * chunks  # every result is in the store, whole
