"""FilingQueue: filing off the tool workers, bounded, on a thread that ends when idle."""
from __future__ import annotations

import sqlite3
import sys
import threading
import time

import pytest
from conftest import wait_for
from loguru import logger

from streamengine import ConfigError, EngineConfig, ToolResult
from streamengine._engine.filing import FILING_OVERHEAD_BYTES, FilingQueue, run_scope, wait_filed
from streamengine.rag import SqliteRagStore

pytestmark = pytest.mark.usefixtures("no_thread_leak")

CONFIG = EngineConfig(model="m")


class HeldStore:
    def __init__(self):
        self.release = threading.Event()
        self.filed = []

    def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
        self.release.wait(10)
        self.filed.append((source, scope))
        return len(chunks)


def ok(n, name="fetch"):
    return ToolResult(f"c{n}", name, True, f"text {n}")


def held_bytes(result):
    """What one waiting filing of ``result`` counts against the bound."""
    return sys.getsizeof(result.text) + FILING_OVERHEAD_BYTES


def test_a_full_queue_refuses_at_once_and_each_refusal_is_one_problem():
    store, problems = HeldStore(), []
    filing = FilingQueue(store, CONFIG, logger, max_pending_bytes=3 * held_bytes(ok(1)))
    tickets = [filing.file(ok(1), "s", problems.append)]
    assert wait_for(lambda: not filing._jobs)  # the thread took the first one and holds it (it still counts)
    tickets += [filing.file(ok(n), "s", problems.append) for n in (2, 3, 4)]
    assert tickets[3].done.is_set()
    assert "the store cannot keep up: 3 filings are waiting (3.2 KiB)" in tickets[3].problem
    assert problems == [tickets[3].problem]
    store.release.set()
    assert all(t.done.wait(5) for t in tickets)
    assert store.filed == [("tool:fetch:c1", "s"), ("tool:fetch:c2", "s"), ("tool:fetch:c3", "s")]
    filing.close(5)


def test_a_store_that_files_nothing_for_the_filing_timeout_is_called_stuck():
    store, problems = HeldStore(), []
    config = EngineConfig(model="m", filing_timeout=0.05)
    filing = FilingQueue(store, config, logger, max_pending_bytes=2 * held_bytes(ok(1)))
    first, second = filing.file(ok(1), "s", problems.append), filing.file(ok(2), "s", problems.append)
    assert wait_for(lambda: "stuck" in (filing.file(ok(3), "s", problems.append).problem or ""))
    assert "the store is stuck or down: no filing finished in" in problems[-1]
    assert "2 filings are waiting (2.1 KiB)" in problems[-1] and "cannot keep up" not in problems[-1]
    store.release.set()
    assert first.done.wait(5) and second.done.wait(5) and first.problem is None and second.problem is None
    filing.close(5)


def test_a_store_that_files_but_too_slowly_is_told_to_be_unable_to_keep_up():
    store, problems = HeldStore(), []
    filing = FilingQueue(store, CONFIG, logger, max_pending_bytes=2 * held_bytes(ok(1)))  # filing_timeout 5 s
    filing.file(ok(1), "s", problems.append)
    assert wait_for(lambda: not filing._jobs)  # the store's call has begun
    filing.file(ok(2), "s", problems.append)
    refused = filing.file(ok(3), "s", problems.append)
    assert "the store cannot keep up: 2 filings are waiting (2.1 KiB)" in refused.problem
    assert "it filed 0 in the last second and its current call has run" in refused.problem
    assert "stuck" not in refused.problem
    store.release.set()
    filing.close(5)


def test_a_result_larger_than_the_bound_is_refused_saying_so():
    filing, problems = FilingQueue(HeldStore(), CONFIG, logger, max_pending_bytes=100), []
    ticket = filing.file(ok(1), "s", problems.append)
    assert "more than the 0.1 KiB that may wait to be filed" in ticket.problem and problems == [ticket.problem]
    assert filing._thread is None


class BatchStore(HeldStore):
    """A store with ``add_many``: each call is one batch (one transaction in a real store)."""

    def __init__(self, fail=False):
        super().__init__()
        self.batches = []
        self.fail = fail

    def add_many(self, filings, embed_model=None):
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("the disk is full")
        self.batches.append([(source, scope) for source, _chunks, scope in filings])
        return [len(chunks) for _source, chunks, _scope in filings]


def test_everything_waiting_is_filed_in_one_store_call():
    store = BatchStore()
    filing = FilingQueue(store, CONFIG, logger)
    tickets = [filing.file(ok(n), f"s{n}", print) for n in range(1, 6)]
    store.release.set()
    assert all(t.done.wait(5) and t.problem is None for t in tickets)
    assert sorted(item for batch in store.batches for item in batch) == [(f"tool:fetch:c{n}", f"s{n}")
                                                                         for n in range(1, 6)]
    assert len(store.batches) <= 2 and store.filed == []  # the first may go alone, the rest together
    filing.close(5)


def test_a_failed_batch_fails_each_of_its_filings_once_with_the_stores_words():
    store, problems = BatchStore(fail=True), []
    filing = FilingQueue(store, CONFIG, logger)
    tickets = [filing.file(ok(n), "s", problems.append) for n in (1, 2, 3)]
    store.release.set()
    assert all(t.done.wait(5) for t in tickets)
    assert sorted(problems) == sorted(t.problem for t in tickets) and len(problems) == 3
    assert all("RuntimeError: the disk is full" in p for p in problems)
    filing.close(5)


@pytest.mark.parametrize("changed", ["in a subclass", "on the instance"])
def test_a_store_whose_add_chunks_alone_was_changed_gets_every_filing_through_it(tmp_path, changed):
    seen = []

    class Signalling(SqliteRagStore):
        def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
            seen.append(source)
            return super().add_chunks(source, chunks, embed_model, scope=scope)

    store = (Signalling if changed == "in a subclass" else SqliteRagStore)(str(tmp_path / "rag.sqlite"))
    if changed == "on the instance":
        add_chunks = store.add_chunks
        store.add_chunks = lambda source, *args, **kwargs: seen.append(source) or add_chunks(source, *args, **kwargs)
    with store:
        filing = FilingQueue(store, CONFIG, logger)
        tickets = [filing.file(ok(n), "s", print) for n in range(1, 6)]
        assert all(t.done.wait(5) and t.problem is None for t in tickets)
        assert sorted(seen) == [f"tool:fetch:c{n}" for n in range(1, 6)] and store.count() == 5
        filing.close(5)


def test_nothing_to_file_gives_no_ticket():
    filing = FilingQueue(HeldStore(), CONFIG, logger)
    assert filing.file(ToolResult("c1", "fetch", False, "", "boom"), "s", print) is None
    assert filing.file(ToolResult("c2", "fetch", True, ""), "s", print) is None
    assert filing.file(ToolResult("c3", "rag_search", True, "hits"), "s", print) is None
    assert filing._thread is None  # no thread for nothing


def test_closing_fails_what_is_still_queued_and_a_late_ticket_counts_once():
    store, problems = HeldStore(), []
    filing = FilingQueue(store, CONFIG, logger)
    first = filing.file(ok(1), "s", problems.append)
    assert wait_for(lambda: not filing._jobs)
    second = filing.file(ok(2), "s", problems.append)
    first.late("took too long")
    filing.close(0.1)  # the first is still held: the second never starts
    assert second.done.is_set() and "closed first" in second.problem
    store.release.set()
    assert first.done.wait(5)
    assert problems == ["took too long", second.problem]  # the first's own outcome is not counted again


def test_the_scope_of_a_run():
    assert run_scope("c-1") == "conversation:c-1"
    assert run_scope(None).startswith("run:") and run_scope(None) != run_scope(None)
    with pytest.raises(ConfigError, match="conversation_id"):
        run_scope("")


def test_a_round_waiting_for_its_filing_is_woken_by_the_filing_thread():
    """wait_filed yields one wait; the ticket's filing ends it through the driver's waker, at once."""
    store, woken = HeldStore(), threading.Event()
    filing = FilingQueue(store, CONFIG, logger)
    ticket = filing.file(ok(1), "s", print)
    steps = wait_filed([ticket], 10.0, threading.Event())
    wait = next(steps)
    assert wait.fileobj is None and not wait.ready()
    wait.waker = woken.set  # what the run's loop sets while it waits
    store.release.set()
    assert woken.wait(5) and wait.ready()
    with pytest.raises(StopIteration):
        steps.send(None)
    assert ticket.problem is None
    filing.close(5)


def test_a_filing_past_the_timeout_is_reported_late_once():
    store, problems = HeldStore(), []
    filing = FilingQueue(store, CONFIG, logger)
    ticket = filing.file(ok(1), "s", problems.append)
    steps = wait_filed([ticket], 0.0, threading.Event())
    assert list(steps) == []  # the timeout is over already: no wait, reported late
    assert len(problems) == 1 and "took longer than 0s (1 filing is waiting (1.1 KiB), it filed 0" in problems[0]
    store.release.set()
    assert ticket.done.wait(5) and len(problems) == 1
    filing.close(5)


def test_a_round_that_stops_waiting_for_a_stuck_store_is_told_it_is_stuck():
    store, problems = HeldStore(), []
    filing = FilingQueue(store, EngineConfig(model="m", filing_timeout=0.05), logger)
    ticket = filing.file(ok(1), "s", problems.append)
    assert list(wait_filed([ticket], 0.3, threading.Event())) != []  # it waited, then gave up
    assert len(problems) == 1 and "(the store is stuck or down: no filing finished in" in problems[0]
    store.release.set()
    assert ticket.done.wait(5)
    filing.close(5)


class FailingStore:
    def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
        raise RuntimeError("database is locked")


def test_a_failed_filing_is_told_before_its_ticket_counts_as_done():
    """The round that sees a ticket done may end the run: the problem must be told by then."""
    filing, told = FilingQueue(FailingStore(), CONFIG, logger), []
    ticket = None
    made = threading.Event()

    def on_problem(problem):
        made.wait(5)
        told.append((problem, ticket.done.is_set()))

    ticket = filing.file(ok(1), "s", on_problem)
    made.set()
    assert ticket.done.wait(5)
    assert len(told) == 1 and "database is locked" in told[0][0]
    assert told[0][1] is False  # not yet done while it was told
    filing.close(5)


# --- one refused result fails alone ---------------------------------------------------------------
# One result the store refuses fails alone: the other runs' results filed in the same batch are filed.
#
# A real SqliteRagStore whose table refuses one text (a trigger, as a CHECK or
# a size limit in a real database would) files a batch in one transaction, all
# or none; the filing thread must then file each result of the failed batch on
# its own.

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
