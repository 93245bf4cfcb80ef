"""Filing tool results in the RAG store, off the tool workers.

A store can be slow or stuck (PostgreSQL down, a table locked, an SQLite
file locked by another process).  Filed on the tool's worker, one stuck
``add_chunks`` held that worker and, with a few runs, the whole pool.  So an
engine with a store has one :class:`FilingQueue`: a bounded queue and its own
thread.  A tool worker only queues (never blocks); a full queue refuses the
filing at once, as a filing error of that run.  The round that made a result
waits for its filing at most ``filing_timeout`` (so the next round's
``rag_search`` finds it), and only for its own calls; a filing late past that
is one filing error, never counted again.

The thread starts with the first filing and ends when the queue has been
empty for ``IDLE_EXIT_S`` (or at :meth:`FilingQueue.close`), so an idle engine
holds no thread.
"""
from __future__ import annotations

import collections
import threading
import time
import uuid
from typing import Any, Callable, Deque, Generator, Optional, Sequence, Tuple

from .. import _validation as validation
from .._clients.base import Flag, Wait
from .._messages import ToolResult

#: Filings waiting at most, per store: past it the store is not keeping up, and a
#: new filing is refused at once (a filing error) instead of piling up memory.
MAX_PENDING = 256
IDLE_EXIT_S = 1.0


def run_scope(conversation_id: Optional[str]) -> str:
    """The RAG scope of one run: its conversation's, or a fresh one of its own.

    The prefixes keep a conversation id from ever naming another run's own
    scope, and rows filed before scopes existed (scope ``''``) from any run's.
    """
    if conversation_id is None:
        return f"run:{uuid.uuid4().hex}"
    return "conversation:" + validation.name(conversation_id, "conversation_id")


class FilingTicket:
    """One result's filing: ``done`` once filed or failed; ``problem`` says what went wrong.

    ``claim()`` is True once: whoever reports the ticket as a filing error
    first (the store's failure, or a round that stopped waiting) counts it.
    """

    def __init__(self, on_problem: Callable[[str], None]) -> None:
        self.done = Flag()  # its setting ends the wait of the round that waits for it (any thread)
        self.problem: Optional[str] = None
        self._on_problem = on_problem
        self._claimed = False
        self._lock = threading.Lock()

    def claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def filed(self) -> None:
        self.done.set()

    def fail(self, problem: str) -> None:
        """Tell the problem, then wake the waiting round.

        In that order: the round that sees the ticket done may end the run at
        once, and a problem told after its ``done`` event would be lost.
        """
        self.problem = problem
        if self.claim():
            self._on_problem(problem)
        self.filed()

    def late(self, problem: str) -> None:
        """The round stopped waiting: report it now, unless its failure already was."""
        if self.claim():
            self._on_problem(problem)


Job = Tuple[ToolResult, str, FilingTicket]


class FilingQueue:
    """Files results of one engine's runs in ``store``, on one thread of its own.

    ``file(result, scope, on_problem)`` returns a :class:`FilingTicket`, or
    None when there is nothing to file (an error, an empty text, a
    ``rag_search`` result, filing turned off).
    """

    def __init__(self, store: Any, config: Any, log: Any, max_pending: int = MAX_PENDING) -> None:
        self.store = store
        self._config = config
        self._log = log
        self._max_pending = max_pending
        self._jobs: Deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def file(self, result: ToolResult, scope: str, on_problem: Callable[[str], None]) -> Optional[FilingTicket]:
        if not self._config.ingest_tool_results or not result.ok or not result.text:
            return None
        if result.name == "rag_search":
            return None  # re-filing search hits would only duplicate what the store already has
        ticket = FilingTicket(on_problem)
        with self._cond:
            refusal = self._refusal()
            if refusal is None:
                self._jobs.append((result, scope, ticket))
                self._cond.notify()
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="streamengine-filing", daemon=True)
                    self._thread.start()
        if refusal is not None:
            ticket.fail(f"the result of tool '{result.name}' was not filed in the RAG store: {refusal}; "
                        f"a later rag_search will not find it")
        return ticket

    def _refusal(self) -> Optional[str]:
        if self._closed:
            return "the engine is closed"
        if len(self._jobs) >= self._max_pending:
            return (f"{len(self._jobs)} filings are already waiting (the store is slow or stuck; "
                    f"the limit is {self._max_pending})")
        return None

    def close(self, timeout: float) -> None:
        """Refuse new filings, let queued ones finish for up to ``timeout`` s, then fail the rest."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            left, self._jobs = list(self._jobs), collections.deque()
        for result, _scope, ticket in left:
            ticket.fail(f"the result of tool '{result.name}' was not filed: the engine closed first")

    # --- the filing thread ---------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            result, scope, ticket = job
            problem = self._ingest(result, scope)
            if problem is None:
                ticket.filed()
            else:
                ticket.fail(problem)

    def _next(self) -> Optional[Job]:
        idle_until = time.monotonic() + IDLE_EXIT_S
        with self._cond:
            while not self._jobs:
                left = idle_until - time.monotonic()
                if self._closed or left <= 0:
                    self._thread = None
                    return None
                self._cond.wait(left)
            return self._jobs.popleft()

    def _ingest(self, result: ToolResult, scope: str) -> Optional[str]:
        """File one successful result; what went wrong, if anything (the store is an aid: never raises)."""
        from ..rag import chunks_for_ingest
        config = self._config
        try:
            chunks = chunks_for_ingest(result.text, config.chunk_size, config.chunk_overlap)
            self.store.add_chunks(f"tool:{result.name}:{result.call_id}", chunks, config.embed_model, scope=scope)
        except Exception as exc:
            self._log.opt(exception=True).warning("could not file result of tool {!r}: {}", result.name, exc)
            return (f"the result of tool '{result.name}' could not be filed in the RAG store "
                    f"({type(exc).__name__}: {exc}); a later rag_search will not find it")
        return None


def wait_filed(tickets: Sequence[FilingTicket], timeout: float,
               cancel: threading.Event) -> Generator[Wait, None, None]:
    """Wait until every ticket is done, ``timeout`` passes or ``cancel`` is set: a wait the run's loop waits out.

    Each open ticket wakes the loop when it is done, so the next round starts
    at once and the driving thread keeps its heartbeats meanwhile.  A ticket
    still open then (unless cancelled) is reported late: one filing error,
    never counted again if the store fails it afterwards.
    """
    waiting = [ticket for ticket in tickets if not ticket.done.is_set()]
    if not waiting:
        return
    wait = Wait(None, until=time.monotonic() + timeout, ready=lambda: all(t.done.is_set() for t in waiting))
    for ticket in waiting:
        ticket.done.wake = wait.wake
    while not wait.ready() and not cancel.is_set() and time.monotonic() < wait.until:  # type: ignore[misc]
        yield wait
    if cancel.is_set():
        return
    for ticket in waiting:
        if not ticket.done.is_set():
            ticket.late(f"filing tool results in the RAG store took longer than {timeout:g}s; "
                        f"the next round may not find them")
