"""Filing tool results in the RAG store, off the tool workers, many at a time.

A store can be slow or stuck (PostgreSQL down, a table locked, an SQLite
file locked by another process).  Filed on the tool's worker, one stuck
``add_chunks`` held that worker and, with a few runs, the whole pool.  So an
engine with a store has one :class:`FilingQueue`: a queue bounded by the
memory its results hold, and a thread of its own.  A tool worker only queues
(never blocks).  The thread files everything waiting at once: through the
store's ``add_many`` where it has one (both of ours), in one transaction and
one embedding call, so a healthy store keeps up with hundreds of runs at once
(filed one by one behind a bound of 256 filings, 200 concurrent runs had a
quarter of their results refused).  A full queue refuses a filing at once, as
a filing error of that run, saying why: the store is stuck (no filing
finished for ``filing_timeout``) or cannot keep up (it says how many it filed
in the last second).  The round that made a result waits for its filing at
most ``filing_timeout`` (so the next round's ``rag_search`` finds it), and
only for its own calls; a filing late past that is one filing error, never
counted again.

The thread starts with the first filing and ends when the queue has been
empty for ``IDLE_EXIT_S`` (or at :meth:`FilingQueue.close`), so an idle engine
holds no thread.
"""
from __future__ import annotations

import collections
import sys
import threading
import time
import uuid
from typing import Any, Callable, Deque, Generator, List, NamedTuple, Optional, Sequence, Tuple

from .. import _validation as validation
from .._config import DEFAULT_MAX_FILING_BYTES
from .._messages import ToolResult
from .._wait import Flag, Wait

#: What the results waiting to be filed may hold, per store, in bytes (their text, plus
#: ``FILING_OVERHEAD_BYTES`` each): past it a new filing is refused at once (a filing error)
#: instead of piling up memory (``EngineConfig.max_filing_bytes``).
MAX_PENDING_BYTES = DEFAULT_MAX_FILING_BYTES
#: What one waiting filing holds besides its text (its ticket, lock and tuples): many tiny ones are bounded too.
FILING_OVERHEAD_BYTES = 1024
#: One store call files at most this much of what is waiting, so a transaction stays short.
MAX_BATCH_BYTES = 4 * 1024 * 1024
MAX_BATCH_FILINGS = 512
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

    def __init__(self, on_problem: Callable[[str], None], explain_delay: Optional[Callable[[], str]] = None) -> None:
        self.done = Flag()  # its setting ends the wait of the round that waits for it (any thread)
        self.problem: Optional[str] = None
        self._on_problem = on_problem
        self.explain_delay = explain_delay  # why the store is slow, for a round that stops waiting
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


class Job(NamedTuple):
    result: ToolResult
    scope: str
    ticket: FilingTicket
    size: int  # bytes held while it waits


class FilingQueue:
    """Files results of one engine's runs in ``store``, on one thread of its own, many in one store call.

    ``file(result, scope, on_problem)`` returns a :class:`FilingTicket`, or
    None when there is nothing to file (an error, an empty text, a
    ``rag_search`` result, filing turned off).  ``max_pending_bytes`` bounds
    the memory of what waits (:data:`MAX_PENDING_BYTES`).
    """

    def __init__(self, store: Any, config: Any, log: Any, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.store = store
        self._add_many = batch_adder(store)
        self._config = config
        self._log = log
        self._max_pending_bytes = validation.count(max_pending_bytes, "max_pending_bytes", minimum=1)
        self._jobs: Deque[Job] = collections.deque()
        self._pending_bytes = 0  # of the jobs queued and of those being filed
        self._pending_count = 0
        self._busy_since: Optional[float] = None  # when the store call in progress began
        self._finished: Deque[Tuple[float, int]] = collections.deque()  # (when, how many) in the last second
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def file(self, result: ToolResult, scope: str, on_problem: Callable[[str], None]) -> Optional[FilingTicket]:
        if not self._config.ingest_tool_results or not result.ok or not result.text:
            return None
        if result.name == "rag_search":
            return None  # re-filing search hits would only duplicate what the store already has
        ticket = FilingTicket(on_problem, self.explain_delay)
        job = Job(result, scope, ticket, sys.getsizeof(result.text) + FILING_OVERHEAD_BYTES)
        with self._cond:
            refusal = self._refusal(job.size)
            if refusal is None:
                self._jobs.append(job)
                self._pending_bytes += job.size
                self._pending_count += 1
                self._cond.notify()
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="streamengine-filing", daemon=True)
                    self._thread.start()
        if refusal is not None:
            ticket.fail(f"the result of tool '{result.name}' was not filed in the RAG store: {refusal}; "
                        f"a later rag_search will not find it")
        return ticket

    def _refusal(self, size: int) -> Optional[str]:
        """Why a filing of ``size`` bytes cannot wait now (None: it can), with the true cause; under the lock."""
        if self._closed:
            return "the engine is closed"
        limit = self._max_pending_bytes
        if self._pending_bytes + size <= limit:
            return None
        if size > limit:
            return (f"it holds {_size(size)}, more than the {_size(limit)} that may wait to be filed "
                    f"(EngineConfig.max_filing_bytes)")
        stuck, state = self._store_state()
        cause = "the store is stuck or down" if stuck else "the store cannot keep up"
        return f"{cause}: {state}; at most {_size(limit)} may wait (EngineConfig.max_filing_bytes)"

    def explain_delay(self) -> str:
        """How the store is doing, for a round that stopped waiting for its filings."""
        with self._cond:
            stuck, state = self._store_state()
        return ("the store is stuck or down: " if stuck else "") + state

    def _store_state(self) -> Tuple[bool, str]:
        """Whether the store is stuck (one store call running for ``filing_timeout`` or more), and the facts."""
        now = time.monotonic()
        busy = 0.0 if self._busy_since is None else now - self._busy_since
        count = self._pending_count
        waiting = f"{count} {'filing is' if count == 1 else 'filings are'} waiting ({_size(self._pending_bytes)})"
        if busy >= self._config.filing_timeout:
            return True, f"no filing finished in {busy:.1f}s and {waiting}"
        running = f" and its current call has run {busy:.1f}s" if self._busy_since is not None else ""
        return False, f"{waiting}, it filed {self._filed_since(now - 1.0)} in the last second{running}"

    def _filed_since(self, since: float) -> int:
        while self._finished and self._finished[0][0] < since:
            self._finished.popleft()
        return sum(n for _, n in self._finished)

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
        for job in left:
            job.ticket.fail(f"the result of tool '{job.result.name}' was not filed: the engine closed first")

    # --- the filing thread ---------------------------------------------------------
    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._file(batch)
            finally:
                with self._cond:
                    self._busy_since = None

    def _next_batch(self) -> Optional[List[Job]]:
        """Everything waiting, up to one batch's bounds; None once idle for ``IDLE_EXIT_S`` or closed."""
        idle_until = time.monotonic() + IDLE_EXIT_S
        with self._cond:
            while not self._jobs:
                left = idle_until - time.monotonic()
                if self._closed or left <= 0:
                    self._thread = None
                    return None
                self._cond.wait(left)
            batch = [self._jobs.popleft()]
            size = batch[0].size
            while (self._jobs and len(batch) < MAX_BATCH_FILINGS
                   and size + self._jobs[0].size <= MAX_BATCH_BYTES):
                batch.append(self._jobs.popleft())
                size += batch[-1].size
            self._busy_since = time.monotonic()
            return batch

    def _file(self, batch: List[Job]) -> None:
        """File the batch: in one ``add_many`` call where the store has one, else one ``add_chunks`` each."""
        from ..rag import Filing, chunks_for_ingest
        config = self._config
        filings: List[Tuple[Job, Any]] = []
        for job in batch:
            try:
                chunks = chunks_for_ingest(job.result.text, config.chunk_size, config.chunk_overlap)
            except Exception as exc:  # the store is an aid: never raises
                self._settle([job], exc)
                continue
            filings.append((job, Filing(f"tool:{job.result.name}:{job.result.call_id}", chunks, job.scope)))
        if self._add_many is not None and filings:
            self._file_together(self._add_many, filings)
            return
        for job, filing in filings:
            self._settle([job], _attempt(self.store.add_chunks, filing.source, filing.chunks, config.embed_model,
                                         scope=filing.scope))

    def _file_together(self, add_many: Callable[..., Any], filings: List[Tuple[Job, Any]]) -> None:
        """One ``add_many`` call (all or none); if it fails, each filing again alone, so one result the store
        refuses fails alone, with its own cause, not the other runs' results that shared its batch.

        The retries stop after ``filing_timeout`` (a store that is down fails every one of them); what is
        left fails with the batch's cause."""
        jobs = [job for job, _ in filings]
        embed_model = self._config.embed_model
        problem = _attempt(add_many, [filing for _, filing in filings], embed_model)
        if problem is None or len(filings) == 1:
            self._settle(jobs, problem)
            return
        self._log.info("filing {} results together failed ({}: {}); filing each alone",
                       len(filings), type(problem).__name__, problem)
        give_up_at = time.monotonic() + self._config.filing_timeout
        for job, filing in filings:
            if time.monotonic() >= give_up_at:
                self._settle([job], problem)
            else:
                self._settle([job], _attempt(add_many, [filing], embed_model))

    def _settle(self, jobs: List[Job], problem: Optional[Exception]) -> None:
        """A store call for ``jobs`` returned: filed (``problem`` None) or failed with ``problem``."""
        if problem is not None:
            self._failed(jobs, problem)
            self._progress(jobs, filed=0)
            return
        for job in jobs:
            job.ticket.filed()
        self._progress(jobs, filed=len(jobs))

    def _progress(self, jobs: List[Job], filed: int) -> None:
        """A store call returned: its jobs no longer wait, ``filed`` of them count as filed, the next call's
        clock starts (so "no filing finished in" measures one call, also when results go one by one)."""
        with self._cond:
            now = time.monotonic()
            self._busy_since = now
            self._pending_bytes -= sum(job.size for job in jobs)
            self._pending_count -= len(jobs)
            if filed:
                self._finished.append((now, filed))
            self._filed_since(now - 1.0)  # forget what is older than a second

    def _failed(self, jobs: List[Job], exc: Exception) -> None:
        names = sorted({job.result.name for job in jobs})
        self._log.opt(exception=exc).warning("could not file {} result(s) of tool(s) {} in the RAG store: {}",
                                              len(jobs), names, exc)
        for job in jobs:
            job.ticket.fail(f"the result of tool '{job.result.name}' could not be filed in the RAG store "
                            f"({type(exc).__name__}: {exc}); a later rag_search will not find it")


def _attempt(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Optional[Exception]:
    """``call(...)``; what it raised, or None (the store is an aid: filing never raises)."""
    try:
        call(*args, **kwargs)
    except Exception as exc:
        return exc
    return None


def batch_adder(store: Any) -> Optional[Callable[..., Any]]:
    """The store's ``add_many``, or None: a store without one, or where ``add_chunks`` was changed closer
    to the store than ``add_many`` (a subclass, or a patch on the instance): that change must see every
    filing, so the engine files through it."""
    add_many = getattr(store, "add_many", None)
    if not callable(add_many):
        return None
    return add_many if _defined_at(store, "add_many") <= _defined_at(store, "add_chunks") else None


def _defined_at(store: Any, name: str) -> int:
    """How close to ``store`` its attribute ``name`` is defined: 0 on the instance, then along its class's MRO."""
    if name in getattr(store, "__dict__", {}):
        return 0
    return next((i for i, klass in enumerate(type(store).__mro__, 1) if name in vars(klass)), sys.maxsize)


def _size(size: int) -> str:
    return f"{size / 1024:.1f} KiB" if size < 1024 * 1024 else f"{size / (1024 * 1024):.1f} MiB"


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
            because = f" ({ticket.explain_delay()})" if ticket.explain_delay is not None else ""
            ticket.late(f"filing tool results in the RAG store took longer than {timeout:g}s{because}; "
                        f"the next round may not find them")
