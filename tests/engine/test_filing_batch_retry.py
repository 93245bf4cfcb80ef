"""One result the store refuses fails alone: the other runs' results filed in the same batch are filed.

A real SqliteRagStore whose table refuses one text (a trigger, as a CHECK or
a size limit in a real database would) files a batch in one transaction, all
or none; the filing thread must then file each result of the failed batch on
its own.
"""
from __future__ import annotations

import sqlite3
import time

import pytest
from conftest import wait_for
from loguru import logger

from streamengine import EngineConfig, ToolResult
from streamengine._engine.filing import FilingQueue
from streamengine.rag import SqliteRagStore

pytestmark = pytest.mark.usefixtures("no_thread_leak")

REFUSAL = "chunk refused by a table constraint"


def result(n: int, text: str = "") -> ToolResult:
    return ToolResult(f"c{n}", "fetch", True, text or f"weather report {n}")


@pytest.fixture
def refusing_store(tmp_path):
    """A store that refuses any chunk holding POISON, and a second connection that can hold its write lock."""
    path = str(tmp_path / "rag.sqlite")
    with SqliteRagStore(path, busy_timeout=10) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("CREATE TRIGGER refuse BEFORE INSERT ON chunks WHEN NEW.text LIKE '%POISON%' "
                      f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END")
        yield store, other
        other.close()


def test_a_refused_result_fails_alone_and_the_rest_of_its_batch_is_filed(refusing_store):
    store, other = refusing_store
    problems = []
    filing = FilingQueue(store, EngineConfig(model="m"), logger)
    other.execute("BEGIN IMMEDIATE")  # the store waits for this lock: what arrives meanwhile waits together
    first = filing.file(result(1), "run-1", problems.append)
    assert wait_for(lambda: not filing._jobs)  # the thread took the first one alone and waits for the lock
    batch = [filing.file(result(2), "run-2", problems.append),
             filing.file(result(3, "POISON in the result"), "run-3", problems.append),
             filing.file(result(4), "run-4", problems.append)]
    assert len(filing._jobs) == 3
    other.execute("COMMIT")
    assert all(ticket.done.wait(10) for ticket in [first, *batch])
    filing.close(5)
    good, refused = [first, batch[0], batch[2]], batch[1]
    assert [ticket.problem for ticket in good] == [None, None, None]
    assert problems == [refused.problem] and REFUSAL in refused.problem and "'fetch'" in refused.problem
    assert sorted(source for source, in other.execute("SELECT source FROM chunks")) == [
        "tool:fetch:c1", "tool:fetch:c2", "tool:fetch:c4"]


class DownStore:
    """A store that is down: each call takes a while, then fails."""

    def __init__(self) -> None:
        self.calls = 0

    def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
        raise AssertionError("the engine files through add_many here")

    def add_many(self, filings, embed_model=None):
        self.calls += 1
        time.sleep(0.05)
        raise ConnectionError("the database is down")


def test_retrying_a_failed_batch_alone_stops_after_the_filing_timeout():
    store, problems = DownStore(), []
    filing = FilingQueue(store, EngineConfig(model="m", filing_timeout=0.2), logger)
    tickets = [filing.file(result(n), "s", problems.append) for n in range(40)]
    assert all(ticket.done.wait(10) for ticket in tickets)
    filing.close(5)
    assert len(problems) == 40 and all("ConnectionError: the database is down" in p for p in problems)
    assert store.calls < 15  # the batch, then retries for 0.2 s: not 40 slow calls more
