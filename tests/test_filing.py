"""FilingQueue: filing off the tool workers, bounded, on a thread that ends when idle."""
from __future__ import annotations

import threading

import pytest
from loguru import logger

from conftest import wait_for
from streamengine._config import EngineConfig
from streamengine._engine.filing import FilingQueue, run_scope, wait_filed
from streamengine._errors import ConfigError
from streamengine._messages import ToolResult

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


def test_a_full_queue_refuses_at_once_and_each_refusal_is_one_problem():
    store, problems = HeldStore(), []
    filing = FilingQueue(store, CONFIG, logger, max_pending=2)
    tickets = [filing.file(ok(1), "s", problems.append)]
    assert wait_for(lambda: not filing._jobs)  # the thread took the first one and holds it
    tickets += [filing.file(ok(n), "s", problems.append) for n in (2, 3, 4)]
    assert tickets[3].done.is_set() and "2 filings are already waiting" in tickets[3].problem
    assert problems == [tickets[3].problem]
    store.release.set()
    assert all(t.done.wait(5) for t in tickets)
    assert store.filed == [("tool:fetch:c1", "s"), ("tool:fetch:c2", "s"), ("tool:fetch:c3", "s")]
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
    assert len(problems) == 1 and "took longer than 0s" in problems[0]
    store.release.set()
    assert ticket.done.wait(5) and len(problems) == 1
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
