"""The run log in one SQLite file (WAL): the processes of one host share it.

Every write is one ``BEGIN IMMEDIATE`` transaction, so writers of any
process are serialized by SQLite's lock and the lease check, the rows and
the run's counters change together.  A blocked reader in the process that
wrote is woken at once; one in another process notices the write by
``PRAGMA data_version`` (which moves when another connection commits),
looked at every ``poll_s``.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Tuple

from .. import _validation as validation
from .._errors import ConfigError
from ._contract import (
    LOST,
    RUNNING,
    Appended,
    ApprovalAnswer,
    Event,
    Frame,
    Lease,
    RunExistsError,
    RunFencedError,
    RunLog,
    RunLogError,
    RunNotFound,
    RunStatus,
    SavedCheckpoint,
    Waiters,
    Waker,
    event_size,
    over_caps,
    parse_meta,
    plan_trim,
    too_many_approvals,
)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, meta TEXT NOT NULL,"
    " state TEXT NOT NULL, token TEXT NOT NULL, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,"
    " size INTEGER NOT NULL, lease_s REAL NOT NULL, retain_s REAL NOT NULL, lease_until REAL NOT NULL,"
    " expires_at REAL NOT NULL, stop INTEGER NOT NULL DEFAULT 0, read_at REAL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS runs_expires_at ON runs (expires_at)",
    "CREATE TABLE IF NOT EXISTS run_events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL,"
    " data TEXT NOT NULL, size INTEGER NOT NULL, terminal INTEGER NOT NULL, PRIMARY KEY (run_id, seq))"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS run_approvals (run_id TEXT NOT NULL, call_id TEXT NOT NULL,"
    " approved INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (run_id, call_id)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS run_checkpoints (run_id TEXT PRIMARY KEY, after_seq INTEGER NOT NULL,"
    " data TEXT NOT NULL) WITHOUT ROWID",
)
_PURGE = (
    "DELETE FROM run_events WHERE run_id IN (SELECT run_id FROM runs WHERE expires_at <= ?)",
    "DELETE FROM run_approvals WHERE run_id IN (SELECT run_id FROM runs WHERE expires_at <= ?)",
    "DELETE FROM run_checkpoints WHERE run_id IN (SELECT run_id FROM runs WHERE expires_at <= ?)",
    "DELETE FROM runs WHERE expires_at <= ?",
)
_PURGE_EVERY_S = 10.0
_Header = Tuple[str, int, int, int, float, float, float, int]  # state first last size lease_s retain_s until stop
_HEADER = ("SELECT state, first_seq, last_seq, size, lease_s, retain_s, lease_until, stop FROM runs"
           " WHERE run_id = ? AND expires_at > ?")


class SqliteRunLog(RunLog):
    """A :class:`RunLog` in a SQLite file in WAL mode, for several worker processes on one host.

    The clock is the host's (``time.time()``), shared by its processes.
    Expired runs are invisible at once and deleted by a purge at most every
    10 s (on ``create``).  ``busy_timeout_s`` bounds a wait for another
    writer; ``poll_s`` is how soon a blocked reader sees another process's write.
    """

    def __init__(self, path: str, *, busy_timeout_s: float = 5.0, poll_s: float = 0.02, **limits: Any) -> None:
        super().__init__(**limits)
        if not isinstance(path, (str, os.PathLike)) or str(path) in ("", ":memory:"):
            raise ConfigError(f"SqliteRunLog needs a file path its workers share, got {path!r}; "
                              "for one process use MemoryRunLog()")
        self.path = os.fspath(path)
        self._busy_timeout_s = validation.seconds(busy_timeout_s, "busy_timeout_s")
        self._poll_s = validation.seconds(poll_s, "poll_s")
        self._lock = threading.Lock()
        self._idle: List[sqlite3.Connection] = []
        self._closed = False
        self._waker = Waker()
        self._next_purge = 0.0
        with self._connection("create its tables") as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                conn.execute(statement)

    # -- connections ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable across a process crash, not a power cut
        return conn

    @contextmanager
    def _connection(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A connection of this log's pool; sqlite errors become RunLogError naming the file."""
        with self._lock:
            if self._closed:
                raise RunLogError(f"the run log {self.path} is closed; create a new SqliteRunLog")
            conn = self._idle.pop() if self._idle else None
        try:
            conn = conn or self._connect()
            yield conn
        except sqlite3.Error as exc:
            raise RunLogError(f"the SQLite run log {self.path} could not {doing} ({type(exc).__name__}: {exc}); "
                              "check the file is writable and not on a network file system") from exc
        finally:
            if conn is not None:
                self._release(conn)

    def _release(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.rollback()
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def _write(self, doing: str) -> Iterator[Tuple[sqlite3.Connection, float]]:
        """One IMMEDIATE transaction (the file's write lock from its first statement) and the time in it."""
        with self._connection(doing) as conn:
            conn.execute("BEGIN IMMEDIATE")
            yield conn, time.time()
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for conn in idle:
            conn.close()

    # -- shared steps --------------------------------------------------------------------

    def _leased(self, conn: sqlite3.Connection, lease: Lease, now: float, doing: str) -> _Header:
        row = conn.execute(_HEADER + " AND token = ? AND state = ?", (lease.run_id, now, lease.token, RUNNING))
        header: Optional[_Header] = row.fetchone()
        if header is None:
            raise RunFencedError(lease.run_id, doing)
        return header

    def _push(self, conn: sqlite3.Connection, run_id: str, header: _Header, events: List[Event],
              terminal: bool) -> Tuple[int, int, int]:
        """Insert the events after the run's last, then trim it to its caps: (first, last, size)."""
        _, first, last, size = header[:4]
        rows = []
        for index, (name, data) in enumerate(events, 1):
            last += 1
            bytes_ = event_size(name, data)
            size += bytes_
            rows.append((run_id, last, name, data, bytes_, int(terminal and index == len(events))))
        conn.executemany("INSERT INTO run_events VALUES (?, ?, ?, ?, ?, ?)", rows)
        if over_caps(first, last, size, self.limits):
            cursor = conn.execute("SELECT seq, size FROM run_events WHERE run_id = ? AND seq >= ? ORDER BY seq",
                                  (run_id, first))
            first, freed = plan_trim(cursor, first, last, size, self.limits)
            cursor.close()
            conn.execute("DELETE FROM run_events WHERE run_id = ? AND seq < ?", (run_id, first))
            size -= freed
        return first, last, size

    def _end(self, conn: sqlite3.Connection, run_id: str, header: _Header, event: Event, state: str,
             now: float) -> int:
        first, last, size = self._push(conn, run_id, header, [event], terminal=True)
        conn.execute("UPDATE runs SET state = ?, first_seq = ?, last_seq = ?, size = ?, expires_at = ?"
                     " WHERE run_id = ?", (state, first, last, size, now + header[5], run_id))
        return last

    def _purge(self, conn: sqlite3.Connection, now: float) -> None:
        if now >= self._next_purge:
            self._next_purge = now + _PURGE_EVERY_S
            for statement in _PURGE:
                conn.execute(statement, (now,))

    # -- RunLog --------------------------------------------------------------------------

    def _do_create(self, lease: Lease, owner: str, meta_json: str) -> None:
        with self._write("create a run") as (conn, now):
            self._purge(conn, now)
            if conn.execute(_HEADER, (lease.run_id, now)).fetchone() is not None:
                raise RunExistsError(f"run {lease.run_id!r} already exists; make a fresh id with new_run_id()")
            # An expired run of that id, not purged yet:
            for table in ("run_events", "run_approvals", "run_checkpoints", "runs"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (lease.run_id,))
            until = now + lease.lease_s
            conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, 1, 0, 0, ?, ?, ?, ?, 0, NULL)",
                         (lease.run_id, owner, meta_json, RUNNING, lease.token, lease.lease_s, lease.retain_s,
                          until, until + lease.retain_s))

    def _do_append(self, lease: Lease, events: List[Event]) -> Appended:
        with self._write("append events") as (conn, now):
            header = self._leased(conn, lease, now, "append to")
            first, last, size = self._push(conn, lease.run_id, header, events, terminal=False)
            until = now + header[4]
            conn.execute("UPDATE runs SET first_seq = ?, last_seq = ?, size = ?, lease_until = ?, expires_at = ?"
                         " WHERE run_id = ?", (first, last, size, until, until + header[5], lease.run_id))
        self._waker.wake(lease.run_id)
        return Appended(last, bool(header[7]))

    def _do_renew(self, lease: Lease) -> None:
        with self._write("renew a lease") as (conn, now):
            header = self._leased(conn, lease, now, "renew the lease of")
            until = now + header[4]
            conn.execute("UPDATE runs SET lease_until = ?, expires_at = ? WHERE run_id = ?",
                         (until, until + header[5], lease.run_id))

    def _do_finish(self, lease: Lease, terminal: Event, state: str) -> int:
        with self._write("finish a run") as (conn, now):
            seq = self._end(conn, lease.run_id, self._leased(conn, lease, now, "finish"), terminal, state, now)
        self._waker.wake(lease.run_id)
        return seq

    def _do_stop_requested(self, lease: Lease) -> bool:
        with self._connection("read the stop flag") as conn:
            return bool(self._leased(conn, lease, time.time(), "poll the stop flag of")[7])

    def _do_approval_answer(self, lease: Lease, call_id: str) -> Optional[ApprovalAnswer]:
        with self._connection("read an approval") as conn:
            self._leased(conn, lease, time.time(), "read an approval of")
            row = conn.execute("SELECT approved, reason FROM run_approvals WHERE run_id = ? AND call_id = ?",
                               (lease.run_id, call_id)).fetchone()
        return None if row is None else ApprovalAnswer(call_id, bool(row[0]), row[1])

    def _owned(self, conn: sqlite3.Connection, run_id: str, owner: str) -> _Header:
        header: Optional[_Header] = conn.execute(_HEADER + " AND owner = ?", (run_id, time.time(), owner)).fetchone()
        if header is None:
            raise RunNotFound(run_id)
        return header

    def _frames(self, conn: sqlite3.Connection, run_id: str, owner: str, after_seq: int,
                limit: int) -> Tuple[List[Frame], bool]:
        """The frames after ``after_seq``, and whether the run ended with the reader holding its terminal."""
        state, _, last = self._owned(conn, run_id, owner)[:3]
        if last <= after_seq:
            return [], state != RUNNING
        rows = conn.execute("SELECT seq, name, data, terminal FROM run_events WHERE run_id = ? AND seq > ?"
                            " ORDER BY seq LIMIT ?", (run_id, after_seq, limit))
        return [Frame(seq, name, data, bool(terminal)) for seq, name, data, terminal in rows], False

    def _do_read(self, run_id: str, owner: str, after_seq: int, timeout_s: float, limit: int) -> List[Frame]:
        deadline = time.monotonic() + timeout_s
        with self._waker.watching(run_id) as waiters, self._connection("read a run") as conn:
            while True:
                seen, version = waiters.version, _data_version(conn)
                frames, ended = self._frames(conn, run_id, owner, after_seq, limit)
                if frames or ended or not self._wait(conn, waiters, seen, version, deadline):
                    return frames

    def _wait(self, conn: sqlite3.Connection, waiters: Waiters, seen: int, version: int, deadline: float) -> bool:
        """Until a write in this process or another, or the deadline; False at the deadline."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if waiters.wait(seen, min(self._poll_s, remaining)) or _data_version(conn) != version:
                return True

    def _do_status(self, run_id: str, owner: str) -> RunStatus:
        with self._connection("read a run's status") as conn:
            now = time.time()
            state, first, last, _, _, _, until, stop = self._owned(conn, run_id, owner)
            meta, read_at = conn.execute("SELECT meta, read_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            terminal = None
            if state != RUNNING:
                row = conn.execute("SELECT name, data FROM run_events WHERE run_id = ? AND seq = ?",
                                   (run_id, last)).fetchone()
                terminal = Frame(last, row[0], row[1], True)
        return RunStatus(run_id, state, first, last, parse_meta(meta), state == RUNNING and now >= until,
                         bool(stop), terminal, None if read_at is None else max(0.0, now - read_at))

    def _do_close_lost(self, run_id: str, event: Event) -> bool:
        with self._write("close a lost run") as (conn, now):
            header: Optional[_Header] = conn.execute(_HEADER, (run_id, now)).fetchone()
            if header is None:
                raise RunNotFound(run_id)
            if header[0] != RUNNING or now < header[6]:
                return False
            self._end(conn, run_id, header, event, LOST, now)
        self._waker.wake(run_id)
        return True

    def _do_take_over(self, run_id: str, token: str) -> Optional[Lease]:
        with self._write("take over a run") as (conn, now):
            header: Optional[_Header] = conn.execute(_HEADER, (run_id, now)).fetchone()
            if header is None:
                raise RunNotFound(run_id)
            state, _, _, _, lease_s, retain_s, until, _ = header
            if state != RUNNING or now < until:
                return None
            conn.execute("UPDATE runs SET token = ?, lease_until = ?, expires_at = ? WHERE run_id = ?",
                         (token, now + lease_s, now + lease_s + retain_s, run_id))
        return Lease(run_id, token, lease_s, retain_s)

    def _do_request_stop(self, run_id: str, owner: str) -> None:
        with self._connection("set the stop flag") as conn:
            done = conn.execute("UPDATE runs SET stop = 1 WHERE run_id = ? AND owner = ? AND expires_at > ?",
                                (run_id, owner, time.time()))
            if done.rowcount == 0:
                raise RunNotFound(run_id)

    def _do_mark_read(self, run_id: str, owner: str) -> None:
        with self._connection("mark a run read") as conn:
            now = time.time()
            done = conn.execute("UPDATE runs SET read_at = ? WHERE run_id = ? AND owner = ? AND expires_at > ?",
                                (now, run_id, owner, now))
            if done.rowcount == 0:
                raise RunNotFound(run_id)

    def _do_answer_approval(self, run_id: str, owner: str, answer: ApprovalAnswer) -> ApprovalAnswer:
        with self._write("store an approval") as (conn, _):
            self._owned(conn, run_id, owner)
            row = conn.execute("SELECT approved, reason FROM run_approvals WHERE run_id = ? AND call_id = ?",
                               (run_id, answer.call_id)).fetchone()
            if row is not None:
                return ApprovalAnswer(answer.call_id, bool(row[0]), row[1])
            count = conn.execute("SELECT count(*) FROM run_approvals WHERE run_id = ?", (run_id,)).fetchone()[0]
            if count >= self.limits.max_approvals:
                raise RunLogError(too_many_approvals(run_id, self.limits.max_approvals))
            conn.execute("INSERT INTO run_approvals VALUES (?, ?, ?, ?)",
                         (run_id, answer.call_id, int(answer.approved), answer.reason))
        return answer

    def _do_save_checkpoint(self, lease: Lease, after_seq: int, data: str) -> bool:
        with self._write("save a checkpoint") as (conn, now):
            self._leased(conn, lease, now, "save a checkpoint of")
            conn.execute("INSERT OR REPLACE INTO run_checkpoints VALUES (?, ?, ?)", (lease.run_id, after_seq, data))
        return True

    def _do_checkpoint(self, run_id: str) -> Optional[SavedCheckpoint]:
        with self._connection("read a checkpoint") as conn:
            row = conn.execute("SELECT c.after_seq, c.data FROM run_checkpoints c JOIN runs r USING (run_id)"
                               " WHERE run_id = ? AND r.expires_at > ?", (run_id, time.time())).fetchone()
        return None if row is None else SavedCheckpoint(int(row[0]), row[1])


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])
