"""The run log's contract: the records, the errors, the checks every log shares.

A run is an append-only log of events with an id, an owner and one producer
holding a lease.  Every log (memory, SQLite, Redis, PostgreSQL) implements the
``_do_*`` methods of :class:`RunLog`; the public methods here check the
arguments once, so a wrong one reads the same whichever engine is underneath.
docs/runs.md states the contract these methods keep.
"""
from __future__ import annotations

import abc
import json
import re
import secrets
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from .. import _validation as validation
from .._errors import ConfigError, StreamEngineError
from .._logs import component_logger

#: A run's states: ``running`` until exactly one terminal event, then one of the others.
RUNNING = "running"
FINISH_STATES = ("done", "cancelled", "failed")  # what a producer's finish() may say
LOST = "lost"  # set only by close_lost(): the producer's lease ran out
TERMINAL_STATES = FINISH_STATES + (LOST,)

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{8,64}\Z")
_EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")  # an SSE event name: no spaces, no line breaks
MAX_CALL_ID_CHARS = 256
MAX_REASON_CHARS = 1000
MAX_READ_FRAMES = 1000
#: The longest a read blocks; a longer wait is a loop of reads (each server connection's timeout exceeds it).
MAX_READ_WAIT_S = 30.0

_log = component_logger("streamengine.runs")


class RunLogError(StreamEngineError):
    """The run log could not do what was asked: the store is unreachable or refused the operation."""


class RunNotFound(RunLogError, LookupError):
    """No such run for this owner; unknown, expired and another owner's runs are indistinguishable."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} for this owner: it never existed, its retention ran out, "
                         "or it belongs to someone else; start a new run")


class RunFencedError(RunLogError):
    """The producer's lease is stale (the run ended, was closed as lost or taken over); nothing was written."""

    def __init__(self, run_id: str, doing: str) -> None:
        self.run_id = run_id
        super().__init__(f"cannot {doing} run {run_id!r}: this producer's lease is no longer valid (the run "
                         "already has its terminal event, was closed as producer_lost, was taken over by "
                         "another worker, or expired); stop producing and cancel its tools")


class RunExistsError(RunLogError):
    """``create`` was given a run id that is already in the log."""


@dataclass(frozen=True)
class Lease:
    """The producer's right to write a run: fenced by ``token``, renewed on the store's clock."""

    run_id: str
    token: str = field(repr=False)
    lease_s: float
    retain_s: float


@dataclass(frozen=True)
class Frame:
    """One event of a run: ``seq`` 1, 2, 3 ... per run; ``data`` is the JSON text as appended."""

    seq: int
    name: str
    data: str
    terminal: bool = False


class Appended(NamedTuple):
    """What :meth:`RunLog.append_and_poll` reports: the batch's last seq, and the stop flag as that write saw it."""

    last_seq: int
    stop_requested: bool


@dataclass(frozen=True)
class ApprovalAnswer:
    """The first answer given to a held tool call; later answers do not change it."""

    call_id: str
    approved: bool
    reason: str


@dataclass(frozen=True)
class RunStatus:
    """Where a run stands.  ``terminal`` is its last frame once it ended (the final answer for ``done``).

    ``lease_expired`` is measured on the store's clock: a running run whose
    producer stopped renewing; a reader then calls :meth:`RunLog.close_lost`.
    """

    run_id: str
    state: str
    first_seq: int
    last_seq: int
    meta: Mapping[str, Any]
    lease_expired: bool
    stop_requested: bool
    terminal: Optional[Frame] = None
    #: Seconds since a reader last called :meth:`RunLog.mark_read` (the store's clock); None: never.
    read_ago_s: Optional[float] = None


@dataclass(frozen=True)
class Gap:
    """Frames after ``after_seq`` were trimmed: the next frame read is ``next_seq``; never a silent jump."""

    after_seq: int
    next_seq: int
    status: RunStatus


ReadItem = Union[Gap, Frame]
Event = Tuple[str, str]


@dataclass(frozen=True)
class SavedCheckpoint:
    """A run's latest checkpoint (``data``, the producer's JSON text), saved when frame ``after_seq`` was its last."""

    after_seq: int
    data: str


@dataclass(frozen=True)
class Limits:
    """What every run of a log may hold, and for how long (each checked once, in :class:`RunLog`)."""

    lease_s: float
    retain_s: float
    max_events: int
    max_bytes: int
    max_approvals: int
    max_checkpoint_bytes: int = 2 << 20


def new_run_id() -> str:
    """128 random bits, URL-safe (22 characters): unguessable, so an id alone reveals nothing."""
    return secrets.token_urlsafe(16)


def new_token() -> str:
    return secrets.token_urlsafe(16)


def lost_event() -> Event:
    """The terminal ``error`` close_lost() appends when a producer's lease ran out."""
    return "error", json.dumps({"message": "the worker producing this run stopped (its lease expired)",
                                "fatal": True, "code": "producer_lost"})


def too_many_approvals(run_id: str, cap: int) -> str:
    return (f"run {run_id!r} already holds {cap} approval answers (max_approvals); "
            "answer only the calls the run asked about")


def event_size(name: str, data: str) -> int:
    """The bytes an event counts against ``max_bytes``: its name and data in UTF-8."""
    return len(name.encode("utf-8", "surrogatepass")) + len(data.encode("utf-8", "surrogatepass"))


def plan_trim(oldest: Iterable[Tuple[int, int]], first_seq: int, last_seq: int, size: int,
              limits: Limits) -> Tuple[int, int]:
    """The new first seq and the bytes freed to bring a run within its caps; the newest event always stays.

    ``oldest`` yields ``(seq, size)`` from ``first_seq`` up, and is read only as far as needed.
    """
    count = last_seq - first_seq + 1
    freed = 0
    for seq, event_bytes in oldest:
        if seq >= last_seq or (count <= limits.max_events and size - freed <= limits.max_bytes):
            break
        freed += event_bytes
        count -= 1
        first_seq = seq + 1
    return first_seq, freed


def over_caps(first_seq: int, last_seq: int, size: int, limits: Limits) -> bool:
    return last_seq - first_seq + 1 > limits.max_events or size > limits.max_bytes


class Waiters:
    """The readers of one run in this process: a version bumped on every change, and a Condition."""

    __slots__ = ("condition", "readers", "version")

    def __init__(self) -> None:
        self.condition = threading.Condition(threading.Lock())
        self.version = 0
        self.readers = 0

    def bump(self) -> None:
        with self.condition:
            self.version += 1
            self.condition.notify_all()

    def wait(self, seen: int, timeout_s: float) -> bool:
        """Until the version moves past ``seen`` or ``timeout_s`` passes; whether it moved."""
        with self.condition:
            return self.condition.wait_for(lambda: self.version != seen, timeout_s)


class Waker:
    """Wakes this process's blocked readers of a run when the run changes (an entry only while one waits).

    A reader registers (``watching``) before it looks at the store, so a
    change between its look and its wait is never missed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: Dict[str, Waiters] = {}

    @contextmanager
    def watching(self, run_id: str) -> Iterator[Waiters]:
        with self._lock:
            waiters = self._runs.get(run_id)
            if waiters is None:
                waiters = self._runs[run_id] = Waiters()
            waiters.readers += 1
        try:
            yield waiters
        finally:
            with self._lock:
                waiters.readers -= 1
                if waiters.readers == 0:
                    del self._runs[run_id]

    def wake(self, run_id: str) -> None:
        with self._lock:
            waiters = self._runs.get(run_id)
        if waiters is not None:
            waiters.bump()

    def wake_all(self) -> None:
        with self._lock:
            everyone = list(self._runs.values())
        for waiters in everyone:
            waiters.bump()


# ------------------------------------------------------------------------- argument checks

def check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ConfigError(f"a run id is 8 to 64 URL-safe characters (A-Z a-z 0-9 _ -), got "
                          f"{validation.short_repr(run_id)}; make one with new_run_id()")
    return run_id


def check_owner(owner: Any) -> str:
    return validation.name(owner, "owner (who may read the run: a user or session id)")


def check_lease(lease: Any) -> Lease:
    if not isinstance(lease, Lease):
        raise ConfigError(f"expected the Lease that create() returned, got {validation.short_repr(lease)}")
    return lease


def check_events(events: Any) -> List[Event]:
    """A batch of ``(name, json_text)``: names are SSE event names, data is text without NUL or CR."""
    if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
        raise ConfigError(f"events must be a list of (name, json_text) pairs, got {validation.short_repr(events)}")
    checked = []
    for event in events:
        if not (isinstance(event, tuple) and len(event) == 2):
            raise ConfigError(f"an event is a (name, json_text) pair, got {validation.short_repr(event)}")
        checked.append(check_event(*event))
    return checked


def check_event(name: Any, data: Any) -> Event:
    if not isinstance(name, str) or not _EVENT_NAME.match(name):
        raise ConfigError(f"an event name is 1 to 64 characters of A-Z a-z 0-9 _ . : -, got "
                          f"{validation.short_repr(name)}")
    if not isinstance(data, str) or "\x00" in data or "\r" in data or "\n" in data:
        raise ConfigError(f"event {name!r}: data must be one line of JSON text (json.dumps output), got "
                          f"{validation.short_repr(data)}")
    return name, data


def check_after(after_seq: Any) -> int:
    return validation.count(after_seq, "after_seq (the last seq the reader has; 0 for all)")


def check_call_id(call_id: Any) -> str:
    validation.name(call_id, "call_id")
    if len(call_id) > MAX_CALL_ID_CHARS:
        raise ConfigError(f"call_id is at most {MAX_CALL_ID_CHARS} characters, got {len(call_id)}")
    return str(call_id)


def check_meta(meta: Any) -> str:
    """``meta`` as JSON text (a dict the web layer reads back in :class:`RunStatus`)."""
    if meta is None:
        return "{}"
    if not isinstance(meta, Mapping):
        raise ConfigError(f"meta must be a dict of JSON values, got {validation.short_repr(meta)}")
    try:
        return json.dumps(dict(meta), separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"meta must hold JSON values only ({exc})") from exc


def make_limits(lease_s: Any, retain_s: Any, max_events: Any, max_bytes: Any, max_approvals: Any,
                max_checkpoint_bytes: Any = Limits.max_checkpoint_bytes) -> Limits:
    return Limits(
        lease_s=validation.seconds(lease_s, "lease_s (how long a producer's lease lasts unrenewed)"),
        retain_s=validation.seconds(retain_s, "retain_s (how long a run is kept after it ends)"),
        max_events=validation.count(max_events, "max_events (events kept per run)", minimum=1),
        max_bytes=validation.count(max_bytes, "max_bytes (bytes of events kept per run)", minimum=1),
        max_approvals=validation.count(max_approvals, "max_approvals (answers kept per run)", minimum=1),
        max_checkpoint_bytes=validation.count(max_checkpoint_bytes, "max_checkpoint_bytes (the largest checkpoint "
                                              "kept per run; 0: none)"),
    )


class RunLog(abc.ABC):
    """An append-only event log per run, shared by whoever opens the same store.

    One producer writes a run through the :class:`Lease` that ``create``
    returns; any number of readers read it by ``(run_id, owner)``, on any
    worker the store reaches.  Every write with a stale lease raises
    :class:`RunFencedError` and writes nothing.
    """

    def __init__(self, *, lease_s: float = 3.0, retain_s: float = 600.0, max_events: int = 10_000,
                 max_bytes: int = 8 << 20, max_approvals: int = 256,
                 max_checkpoint_bytes: int = Limits.max_checkpoint_bytes) -> None:
        self.limits = make_limits(lease_s, retain_s, max_events, max_bytes, max_approvals, max_checkpoint_bytes)

    # -- the producer ----------------------------------------------------------------------

    def create(self, run_id: str, owner: str, meta: Optional[Mapping[str, Any]] = None, *,
               lease_s: Optional[float] = None, retain_s: Optional[float] = None) -> Lease:
        """A new running run with no events; its producer's :class:`Lease` (raises RunExistsError if taken).

        ``lease_s`` and ``retain_s`` default to the log's; the run keeps its own.
        """
        lease = Lease(check_run_id(run_id), new_token(),
                      validation.seconds(self.limits.lease_s if lease_s is None else lease_s, "lease_s"),
                      validation.seconds(self.limits.retain_s if retain_s is None else retain_s, "retain_s"))
        self._do_create(lease, check_owner(owner), check_meta(meta))
        return lease

    def append(self, lease: Lease, events: Sequence[Event]) -> int:
        """Append a batch as seq last+1, last+2 ...; the last seq.  Renews the lease.  Fenced."""
        return self.append_and_poll(lease, events).last_seq

    def append_and_poll(self, lease: Lease, events: Sequence[Event]) -> Appended:
        """:meth:`append`, also reporting the stop flag: a producer that appends often need not poll it.

        Every log reads the flag in the same atomic step as the write, so it
        costs no extra round trip.
        """
        return self._do_append(check_lease(lease), check_events(events))

    def renew(self, lease: Lease) -> None:
        """Extend the lease by ``lease_s`` from now on the store's clock.  Fenced."""
        self._do_renew(check_lease(lease))

    def finish(self, lease: Lease, terminal: Event, *, state: str = "done") -> int:
        """Append the run's one terminal event and end it as ``state``; its seq.  Fenced: nothing after it."""
        if state not in FINISH_STATES:
            raise ConfigError(f"finish(state=...) is one of {', '.join(FINISH_STATES)}, got {state!r} "
                              "(a lost producer is closed by close_lost())")
        if not isinstance(terminal, tuple) or len(terminal) != 2:
            raise ConfigError(f"the terminal event is a (name, json_text) pair, got {validation.short_repr(terminal)}")
        return self._do_finish(check_lease(lease), check_event(*terminal), state)

    def stop_requested(self, lease: Lease) -> bool:
        """Whether a reader asked the run to stop (one cheap look-up).  Fenced."""
        return self._do_stop_requested(check_lease(lease))

    def approval_answer(self, lease: Lease, call_id: str) -> Optional[ApprovalAnswer]:
        """The answer given to ``call_id``, or None while there is none.  Fenced."""
        return self._do_approval_answer(check_lease(lease), check_call_id(call_id))

    def save_checkpoint(self, lease: Lease, after_seq: int, data: Optional[str]) -> bool:
        """Keep ``data`` as the run's checkpoint, taken when frame ``after_seq`` was the last; whether it was kept.

        It replaces the one before, atomically.  ``data`` None, or longer than
        ``max_checkpoint_bytes``, clears it instead (a takeover then finds
        none, and the run can only be closed as producer_lost): an older
        checkpoint must not outlive a round that was not saved.  Fenced.
        """
        after_seq = check_after(after_seq)
        if data is not None and not isinstance(data, str):
            raise ConfigError(f"a checkpoint is JSON text or None, got {validation.short_repr(data)}")
        size = 0 if data is None else len(data.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_checkpoint_bytes:
            _log.warning("run {}: its checkpoint after seq {} is {} bytes, over max_checkpoint_bytes={}: none is "
                         "kept, so if its worker dies the run is closed as producer_lost, not taken over",
                         lease.run_id, after_seq, size, self.limits.max_checkpoint_bytes)
            data = None
        return self._do_save_checkpoint(check_lease(lease), after_seq, data or "") and data is not None

    def checkpoint(self, run_id: str) -> Optional[SavedCheckpoint]:
        """The run's latest checkpoint, None when it has none (never saved, cleared, or a log that keeps none).

        For the worker that takes a run over (:meth:`take_over`); the run's
        owner was checked by whoever found the run.
        """
        found = self._do_checkpoint(check_run_id(run_id))
        return found if found is not None and found.data else None

    # -- readers ----------------------------------------------------------------------------

    def read(self, run_id: str, owner: str, after_seq: int = 0, timeout_s: float = 0.0,
             limit: int = MAX_READ_FRAMES) -> List[ReadItem]:
        """The frames after ``after_seq`` (at most ``limit``), waiting up to ``timeout_s`` for new ones.

        A :class:`Gap` comes first when frames after ``after_seq`` were
        trimmed.  An empty list means nothing new within the timeout, or the
        run ended and the reader has its terminal frame.
        """
        timeout_s = validation.seconds(timeout_s, "timeout_s", allow_zero=True)
        if timeout_s > MAX_READ_WAIT_S:
            raise ConfigError(f"timeout_s is at most {MAX_READ_WAIT_S:g} s per read, got {timeout_s:g}; read again")
        limit = validation.count(limit, "limit (frames per read)", minimum=1)
        run_id, owner, after_seq = check_run_id(run_id), check_owner(owner), check_after(after_seq)
        frames = self._do_read(run_id, owner, after_seq, timeout_s, min(limit, MAX_READ_FRAMES))
        if frames and frames[0].seq > after_seq + 1:
            return [Gap(after_seq, frames[0].seq, self.status(run_id, owner)), *frames]
        return list(frames)

    def status(self, run_id: str, owner: str) -> RunStatus:
        """Where the run stands (raises RunNotFound for unknown, expired and other owners' runs)."""
        return self._do_status(check_run_id(run_id), check_owner(owner))

    def close_lost(self, run_id: str) -> bool:
        """End a run whose lease expired with ``error{fatal, code: producer_lost}``; whether this call did.

        Atomic with every other write: a run gets exactly one terminal event,
        so a producer finishing at the same moment either wins or is fenced.
        """
        return self._do_close_lost(check_run_id(run_id), lost_event())

    def take_over(self, run_id: str) -> Optional[Lease]:
        """A new lease on a running run whose lease expired, for a worker that goes on producing it.

        The old lease is fenced from then on.  None when the run ended or its
        lease still holds; atomic with close_lost() and the producer's writes.
        """
        return self._do_take_over(check_run_id(run_id), new_token())

    def request_stop(self, run_id: str, owner: str) -> None:
        """Ask the run's producer, wherever it runs, to stop; idempotent."""
        self._do_request_stop(check_run_id(run_id), check_owner(owner))

    def mark_read(self, run_id: str, owner: str) -> None:
        """A reader is here, on whatever worker: a detached run's producer sees it as ``read_ago_s``.

        Readers call it every second or so while they follow a run, so a
        producer whose client went away knows whether someone came back
        elsewhere (or cancels the run as abandoned after its grace).
        """
        self._do_mark_read(check_run_id(run_id), check_owner(owner))

    def answer_approval(self, run_id: str, owner: str, call_id: str, approved: bool,
                        reason: str = "") -> ApprovalAnswer:
        """Answer a held tool call; the first answer wins and is returned, whatever this one said."""
        if not isinstance(approved, bool):
            raise ConfigError(f"approved must be true or false, got {validation.short_repr(approved)}")
        if not isinstance(reason, str):
            raise ConfigError(f"reason must be a string, got {validation.short_repr(reason)}")
        answer = ApprovalAnswer(check_call_id(call_id), approved, reason[:MAX_REASON_CHARS])
        return self._do_answer_approval(check_run_id(run_id), check_owner(owner), answer)

    # -- lifetime ----------------------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and threads; idempotent."""

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- what each engine implements ---------------------------------------------------------

    @abc.abstractmethod
    def _do_create(self, lease: Lease, owner: str, meta_json: str) -> None: ...

    @abc.abstractmethod
    def _do_append(self, lease: Lease, events: List[Event]) -> Appended: ...

    @abc.abstractmethod
    def _do_renew(self, lease: Lease) -> None: ...

    @abc.abstractmethod
    def _do_finish(self, lease: Lease, terminal: Event, state: str) -> int: ...

    @abc.abstractmethod
    def _do_stop_requested(self, lease: Lease) -> bool: ...

    @abc.abstractmethod
    def _do_approval_answer(self, lease: Lease, call_id: str) -> Optional[ApprovalAnswer]: ...

    @abc.abstractmethod
    def _do_read(self, run_id: str, owner: str, after_seq: int, timeout_s: float, limit: int) -> List[Frame]: ...

    @abc.abstractmethod
    def _do_status(self, run_id: str, owner: str) -> RunStatus: ...

    @abc.abstractmethod
    def _do_close_lost(self, run_id: str, event: Event) -> bool: ...

    @abc.abstractmethod
    def _do_take_over(self, run_id: str, token: str) -> Optional[Lease]: ...

    @abc.abstractmethod
    def _do_request_stop(self, run_id: str, owner: str) -> None: ...

    @abc.abstractmethod
    def _do_mark_read(self, run_id: str, owner: str) -> None: ...

    @abc.abstractmethod
    def _do_answer_approval(self, run_id: str, owner: str, answer: ApprovalAnswer) -> ApprovalAnswer: ...

    # A log of your own that keeps no checkpoints still works: its runs are closed as producer_lost.
    def _do_save_checkpoint(self, lease: Lease, after_seq: int, data: str) -> bool:
        """Replace the run's checkpoint with ``data`` ("" clears it) under the lease; whether it was kept."""
        return False

    def _do_checkpoint(self, run_id: str) -> Optional[SavedCheckpoint]:
        return None


def parse_meta(meta_json: str) -> Dict[str, Any]:
    meta = json.loads(meta_json)
    return meta if isinstance(meta, dict) else {}
