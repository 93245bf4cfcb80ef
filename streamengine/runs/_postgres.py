"""The run log in PostgreSQL: three tables, and LISTEN/NOTIFY to wake readers.

Every write is one transaction that starts with an ``UPDATE`` of the run's
row guarded by its lease token and state, so the token check and the write
are one statement, and the row lock orders a producer's append, its finish
and a reader's ``close_lost``.  The clock is the server's
(``clock_timestamp()``).  Each write notifies the log's channel with the
run id; one listening connection per log (a thread, started by the first
blocked read) wakes that run's readers in this process, and a reader also
looks again every ``poll_s`` in case a notification was lost with a
connection.  psycopg is imported when a log is made.
"""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .. import _validation as validation
from .._errors import ConfigError
from .._logs import Redactor
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
    Waker,
    event_size,
    over_caps,
    parse_meta,
    plan_trim,
    too_many_approvals,
)

_TABLE_RE = re.compile(r"[a-z_][a-z0-9_]{0,40}\Z")  # leaves room for the suffixes
_NOW = "extract(epoch from clock_timestamp())"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS {runs} (run_id text PRIMARY KEY, owner text NOT NULL, meta text NOT NULL,"
    " state text NOT NULL, token text NOT NULL, first_seq bigint NOT NULL, last_seq bigint NOT NULL,"
    " size bigint NOT NULL, lease_s float8 NOT NULL, retain_s float8 NOT NULL, lease_until float8 NOT NULL,"
    " expires_at float8 NOT NULL, stop boolean NOT NULL DEFAULT false)",
    "ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS read_at float8",
    "ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS cp_seq bigint",  # the run's checkpoint: the seq it follows,
    "ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS cp_data text",  # and its JSON text
    "CREATE INDEX IF NOT EXISTS {runs_expires} ON {runs} (expires_at)",
    "CREATE TABLE IF NOT EXISTS {events} (run_id text NOT NULL REFERENCES {runs} ON DELETE CASCADE,"
    " seq bigint NOT NULL, name text NOT NULL, data text NOT NULL, size integer NOT NULL,"
    " terminal boolean NOT NULL, PRIMARY KEY (run_id, seq))",
    "CREATE TABLE IF NOT EXISTS {approvals} (run_id text NOT NULL REFERENCES {runs} ON DELETE CASCADE,"
    " call_id text NOT NULL, approved boolean NOT NULL, reason text NOT NULL, PRIMARY KEY (run_id, call_id))",
)
_LIVE = f"run_id = %(run_id)s AND expires_at > {_NOW}"
_LEASED = f"{_LIVE} AND token = %(token)s AND state = 'running'"
# One statement writes a run: the guarded UPDATE of its row (no row: fenced or not due, nothing
# written), the events numbered after its new last seq, and the notification (sent at commit).
# {sets} and {where} are this module's own SQL text, never a caller's.
_WRITE = ("WITH run AS (UPDATE {{runs}} SET last_seq = last_seq + %(n)s, size = size + %(size)s, {sets}"
          " WHERE {where} RETURNING first_seq, last_seq, size, stop),"
          " added AS (INSERT INTO {{events}} (run_id, seq, name, data, size, terminal)"
          " SELECT %(run_id)s, run.last_seq - %(n)s + t.o, t.n, t.d, t.s, t.o = %(n)s AND %(final)s"
          " FROM run, unnest(%(names)s::text[], %(datas)s::text[], %(sizes)s::int[]) WITH ORDINALITY AS t(n, d, s, o))"
          " SELECT first_seq, last_seq, size, stop,"
          " CASE WHEN %(n)s > 0 THEN pg_notify(%(channel)s, %(run_id)s)::text END FROM run")
_TRIM_PAGE = 256
_PURGE_EVERY_S = 10.0


def _import_psycopg() -> Tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ConfigError(f"PostgresRunLog needs psycopg 3 and psycopg_pool ({exc}); "
                          "install them with: pip install 'streamengine[postgres]'") from exc
    return psycopg, psycopg_pool


class PostgresRunLog(RunLog):
    """A :class:`RunLog` in PostgreSQL, for those who already run it: several hosts share it.

    Tables ``{table}``, ``{table}_events`` and ``{table}_approvals`` are
    created on first open (under an advisory lock); the channel is
    ``{table}``.  Statements run on a pool of ``pool_size`` connections, each
    wait bounded by ``timeout_s``.  Expired runs are invisible at once and
    deleted (with their events) at most every 10 s, on ``create``.  Make the
    log in each process after a fork: neither pool nor listener survives one.
    """

    def __init__(self, dsn: str, *, table: str = "streamengine_runs", pool_size: int = 4, timeout_s: float = 5.0,
                 poll_s: float = 1.0, **limits: Any) -> None:
        super().__init__(**limits)
        self._psycopg, psycopg_pool = _import_psycopg()
        self.dsn = validation.name(dsn, "dsn (postgresql://user@host/db)")
        self._redact = Redactor([self._password()])
        self.safe_dsn = self._redact(dsn)
        if not isinstance(table, str) or not _TABLE_RE.match(table):
            raise ConfigError(f"table must be a lower-case SQL name of at most 41 characters, got {table!r}")
        self.table = table
        self._timeout_s = validation.seconds(timeout_s, "timeout_s")
        self._poll_s = validation.seconds(poll_s, "poll_s")
        validation.count(pool_size, "pool_size (connections per process)", minimum=1)
        self._waker = Waker()
        self._listener = _Listener(self)
        self._next_purge = 0.0
        self._create_schema()
        self._pool = self._open_pool(psycopg_pool, pool_size)

    # -- setup ---------------------------------------------------------------------------

    def _password(self) -> Optional[str]:
        try:
            return self._psycopg.conninfo.conninfo_to_dict(self.dsn).get("password")  # type: ignore[no-any-return]
        except self._psycopg.ProgrammingError as exc:
            raise ConfigError(f"not a PostgreSQL DSN ({exc}); write postgresql://user@host/db") from None

    def _sql(self, template: str) -> Any:
        """A statement on this log's tables; the names are quoted, never pasted."""
        sql = self._psycopg.sql
        return sql.SQL(template).format(
            runs=sql.Identifier(self.table), events=sql.Identifier(f"{self.table}_events"),
            approvals=sql.Identifier(f"{self.table}_approvals"),
            runs_expires=sql.Identifier(f"{self.table}_expires"))

    def connect(self, **options: Any) -> Any:
        """A new connection with this log's bounded waits (the listener's, and the schema's)."""
        millis = max(1, int(self._timeout_s * 1000))
        return self._psycopg.connect(self.dsn, connect_timeout=max(2, int(self._timeout_s)),
                                     options=f"-c statement_timeout={millis} -c lock_timeout={millis}", **options)

    def _create_schema(self) -> None:
        try:
            with self.connect() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"streamengine.runs:{self.table}"])
                for statement in _SCHEMA:
                    conn.execute(self._sql(statement))
        except self._psycopg.Error as exc:
            raise ConfigError(f"cannot use the PostgreSQL run log at {self.safe_dsn} ({type(exc).__name__}: "
                              f"{self._redact(str(exc))}); check that the server runs and accepts this DSN, "
                              "and that the user may create tables") from exc

    def _open_pool(self, psycopg_pool: Any, pool_size: int) -> Any:
        millis = max(1, int(self._timeout_s * 1000))
        pool = psycopg_pool.ConnectionPool(
            self.dsn, min_size=1, max_size=pool_size, open=False, num_workers=1, timeout=self._timeout_s,
            name=f"streamengine-runs-{self.table}", check=psycopg_pool.ConnectionPool.check_connection,
            kwargs={"connect_timeout": max(2, int(self._timeout_s)),
                    "options": f"-c statement_timeout={millis} -c lock_timeout={millis}"})
        try:
            pool.open(wait=True, timeout=self._timeout_s)
        except self._psycopg.Error as exc:
            pool.close()
            raise ConfigError(f"cannot open connections to the PostgreSQL run log at {self.safe_dsn} "
                              f"({self._redact(str(exc))}); check the server's max_connections") from exc
        return pool

    def close(self) -> None:
        self._listener.stop()
        self._pool.close()

    @contextmanager
    def _transaction(self, doing: str) -> Iterator[Any]:
        """A pooled connection in one transaction (committed on success); errors name the log, not a secret."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except self._psycopg.Error as exc:
            hint = "; is the server up?" if isinstance(exc, self._psycopg.OperationalError) else ""
            raise RunLogError(f"the PostgreSQL run log at {self.safe_dsn} could not {doing} "
                              f"({type(exc).__name__}: {self._redact(str(exc))}){hint}") from exc

    # -- shared steps --------------------------------------------------------------------

    def _one(self, conn: Any, template: str, params: Any) -> Any:
        return conn.execute(self._sql(template), params).fetchone()

    def _write(self, run_id: str, events: List[Event], sets: str, where: str, params: Dict[str, Any],
               doing: str) -> Optional[Appended]:
        """Append ``events`` where the guard holds, trimmed to the caps; the last seq and the stop flag, or None
        if it did not."""
        sizes = [event_size(name, data) for name, data in events]
        params = {**params, "run_id": run_id, "n": len(events), "size": sum(sizes), "channel": self.table,
                  "names": [name for name, _ in events], "datas": [data for _, data in events], "sizes": sizes}
        with self._transaction(doing) as conn:
            written = self._one(conn, _WRITE.format(sets=sets, where=where), params)
            if written is None:
                return None
            first, last, size, stop = written[:4]
            if over_caps(first, last, size, self.limits):
                self._trim(conn, run_id, first, last, size)
        return Appended(int(last), bool(stop))

    def _trim(self, conn: Any, run_id: str, first: int, last: int, size: int) -> None:
        new_first, freed = plan_trim(self._oldest(conn, run_id, first), first, last, size, self.limits)
        conn.execute(self._sql("DELETE FROM {events} WHERE run_id = %s AND seq < %s"), [run_id, new_first])
        conn.execute(self._sql("UPDATE {runs} SET first_seq = %s, size = size - %s WHERE run_id = %s"),
                     [new_first, freed, run_id])

    def _oldest(self, conn: Any, run_id: str, first: int) -> Iterator[Tuple[int, int]]:
        """``(seq, size)`` of the run's events from ``first`` up, a page at a time (a trim reads only a few)."""
        while True:
            page = conn.execute(self._sql("SELECT seq, size FROM {events} WHERE run_id = %s AND seq >= %s"
                                          " ORDER BY seq LIMIT %s"), [run_id, first, _TRIM_PAGE]).fetchall()
            yield from page
            if len(page) < _TRIM_PAGE:
                return
            first = page[-1][0] + 1

    def _produce(self, lease: Lease, events: List[Event], final_state: Optional[str], doing: str) -> Appended:
        """A producer's write, fenced by its token: an append (with a renewal), a renewal, or the terminal."""
        sets = (f"state = %(state)s, expires_at = {_NOW} + retain_s" if final_state else
                f"lease_until = {_NOW} + lease_s, expires_at = {_NOW} + lease_s + retain_s")
        params = {"token": lease.token, "state": final_state, "final": final_state is not None}
        written = self._write(lease.run_id, events, sets, _LEASED, params, doing)
        if written is None:
            raise RunFencedError(lease.run_id, doing)
        return written

    def _purge(self, conn: Any) -> None:
        now = time.monotonic()
        if now >= self._next_purge:
            self._next_purge = now + _PURGE_EVERY_S
            conn.execute(self._sql(f"DELETE FROM {{runs}} WHERE expires_at <= {_NOW}"))

    # -- RunLog --------------------------------------------------------------------------

    def _do_create(self, lease: Lease, owner: str, meta_json: str) -> None:
        params = {"run_id": lease.run_id, "owner": owner, "meta": meta_json, "token": lease.token,
                  "lease_s": lease.lease_s, "retain_s": lease.retain_s}
        with self._transaction("create a run") as conn:
            self._purge(conn)
            conn.execute(self._sql(f"DELETE FROM {{runs}} WHERE run_id = %(run_id)s AND expires_at <= {_NOW}"),
                         params)
            made = self._one(conn, "INSERT INTO {runs} VALUES (%(run_id)s, %(owner)s, %(meta)s, 'running',"
                                   f" %(token)s, 1, 0, 0, %(lease_s)s, %(retain_s)s, {_NOW} + %(lease_s)s,"
                                   f" {_NOW} + %(lease_s)s + %(retain_s)s) ON CONFLICT (run_id) DO NOTHING"
                                   " RETURNING 1", params)
        if made is None:
            raise RunExistsError(f"run {lease.run_id!r} already exists; make a fresh id with new_run_id()")

    def _do_append(self, lease: Lease, events: List[Event]) -> Appended:
        return self._produce(lease, events, None, "append to")

    def _do_renew(self, lease: Lease) -> None:
        self._produce(lease, [], None, "renew the lease of")

    def _do_finish(self, lease: Lease, terminal: Event, state: str) -> int:
        return self._produce(lease, [terminal], state, "finish").last_seq

    def _do_stop_requested(self, lease: Lease) -> bool:
        with self._transaction("read the stop flag") as conn:
            row = self._one(conn, f"SELECT stop FROM {{runs}} WHERE {_LEASED}",
                            {"run_id": lease.run_id, "token": lease.token})
        if row is None:
            raise RunFencedError(lease.run_id, "poll the stop flag of")
        return bool(row[0])

    def _do_approval_answer(self, lease: Lease, call_id: str) -> Optional[ApprovalAnswer]:
        params = {"run_id": lease.run_id, "token": lease.token, "call_id": call_id}
        with self._transaction("read an approval") as conn:
            row = self._one(conn, "SELECT a.approved, a.reason FROM {runs} r LEFT JOIN {approvals} a"
                                  " ON a.run_id = r.run_id AND a.call_id = %(call_id)s"
                                  f" WHERE r.run_id = %(run_id)s AND r.expires_at > {_NOW} AND r.token = %(token)s"
                                  " AND r.state = 'running'", params)
        if row is None:
            raise RunFencedError(lease.run_id, "read an approval of")
        return None if row[0] is None else ApprovalAnswer(call_id, bool(row[0]), row[1])

    def _frames(self, run_id: str, owner: str, after_seq: int, limit: int) -> Tuple[List[Frame], bool]:
        """The frames after ``after_seq``, and whether the run ended with the reader holding its terminal."""
        params = {"run_id": run_id, "owner": owner, "after": after_seq, "limit": limit}
        with self._transaction("read a run") as conn:
            head = self._one(conn, f"SELECT state, last_seq FROM {{runs}} WHERE {_LIVE} AND owner = %(owner)s",
                             params)
            if head is None:
                raise RunNotFound(run_id)
            if head[1] <= after_seq:
                return [], head[0] != RUNNING
            rows = conn.execute(self._sql("SELECT seq, name, data, terminal FROM {events} WHERE run_id = %(run_id)s"
                                          " AND seq > %(after)s ORDER BY seq LIMIT %(limit)s"), params).fetchall()
        return [Frame(seq, name, data, terminal) for seq, name, data, terminal in rows], False

    def _do_read(self, run_id: str, owner: str, after_seq: int, timeout_s: float, limit: int) -> List[Frame]:
        deadline = time.monotonic() + timeout_s
        with self._waker.watching(run_id) as waiters:
            while True:
                seen = waiters.version
                frames, ended = self._frames(run_id, owner, after_seq, limit)
                remaining = deadline - time.monotonic()
                if frames or ended or remaining <= 0:
                    return frames
                if self._listener.start():  # the first wait: notifications now flow, look once more
                    continue
                waiters.wait(seen, min(self._poll_s, remaining))

    def _do_status(self, run_id: str, owner: str) -> RunStatus:
        params = {"run_id": run_id, "owner": owner}
        with self._transaction("read a run's status") as conn:
            row = self._one(conn, "SELECT state, first_seq, last_seq, meta,"
                                  f" state = 'running' AND lease_until <= {_NOW}, stop,"
                                  f" CASE WHEN read_at IS NOT NULL THEN greatest(0, {_NOW} - read_at) END"
                                  f" FROM {{runs}} WHERE {_LIVE} AND owner = %(owner)s", params)
            if row is None:
                raise RunNotFound(run_id)
            state, first, last, meta, expired, stop, read_ago = row
            terminal = None
            if state != RUNNING:
                event = self._one(conn, "SELECT name, data FROM {events} WHERE run_id = %s AND seq = %s",
                                  [run_id, last])
                terminal = Frame(last, event[0], event[1], True)
        return RunStatus(run_id, state, first, last, parse_meta(meta), bool(expired), bool(stop), terminal,
                         None if read_ago is None else float(read_ago))

    def _do_close_lost(self, run_id: str, event: Event) -> bool:
        sets = f"state = %(state)s, expires_at = {_NOW} + retain_s"
        due = f"{_LIVE} AND state = 'running' AND lease_until <= {_NOW}"
        params = {"state": LOST, "final": True}
        if self._write(run_id, [event], sets, due, params, "close a lost run") is not None:
            return True
        with self._transaction("look up a run") as conn:
            if self._one(conn, f"SELECT 1 FROM {{runs}} WHERE {_LIVE}", {"run_id": run_id}) is None:
                raise RunNotFound(run_id)
        return False

    def _do_take_over(self, run_id: str, token: str) -> Optional[Lease]:
        with self._transaction("take over a run") as conn:
            taken = self._one(conn, f"UPDATE {{runs}} SET token = %(token)s, lease_until = {_NOW} + lease_s,"
                                    f" expires_at = {_NOW} + lease_s + retain_s WHERE {_LIVE}"
                                    f" AND state = 'running' AND lease_until <= {_NOW} RETURNING lease_s, retain_s",
                              {"run_id": run_id, "token": token})
            if taken is None and self._one(conn, f"SELECT 1 FROM {{runs}} WHERE {_LIVE}", {"run_id": run_id}) is None:
                raise RunNotFound(run_id)
        return None if taken is None else Lease(run_id, token, taken[0], taken[1])

    def _do_request_stop(self, run_id: str, owner: str) -> None:
        with self._transaction("set the stop flag") as conn:
            done = conn.execute(self._sql(f"UPDATE {{runs}} SET stop = true WHERE {_LIVE} AND owner = %(owner)s"),
                                {"run_id": run_id, "owner": owner})
            if done.rowcount == 0:
                raise RunNotFound(run_id)

    def _do_mark_read(self, run_id: str, owner: str) -> None:
        with self._transaction("mark a run read") as conn:
            done = conn.execute(self._sql(f"UPDATE {{runs}} SET read_at = {_NOW} WHERE {_LIVE} AND owner = %(owner)s"),
                                {"run_id": run_id, "owner": owner})
            if done.rowcount == 0:
                raise RunNotFound(run_id)

    def _do_answer_approval(self, run_id: str, owner: str, answer: ApprovalAnswer) -> ApprovalAnswer:
        params = {"run_id": run_id, "owner": owner, "call_id": answer.call_id, "approved": answer.approved,
                  "reason": answer.reason}
        with self._transaction("store an approval") as conn:
            # The run's row lock orders answers to one run, so the count below holds.
            if self._one(conn, f"SELECT 1 FROM {{runs}} WHERE {_LIVE} AND owner = %(owner)s FOR UPDATE",
                         params) is None:
                raise RunNotFound(run_id)
            stored = self._one(conn, "SELECT approved, reason FROM {approvals} WHERE run_id = %(run_id)s"
                                     " AND call_id = %(call_id)s", params)
            if stored is not None:
                return ApprovalAnswer(answer.call_id, bool(stored[0]), stored[1])
            count = self._one(conn, "SELECT count(*) FROM {approvals} WHERE run_id = %(run_id)s", params)[0]
            if count >= self.limits.max_approvals:
                raise RunLogError(too_many_approvals(run_id, self.limits.max_approvals))
            conn.execute(self._sql("INSERT INTO {approvals} VALUES (%(run_id)s, %(call_id)s, %(approved)s,"
                                   " %(reason)s)"), params)
        return answer

    def _do_save_checkpoint(self, lease: Lease, after_seq: int, data: str) -> bool:
        with self._transaction("save a checkpoint") as conn:
            done = conn.execute(self._sql(f"UPDATE {{runs}} SET cp_seq = %(seq)s, cp_data = %(data)s WHERE {_LEASED}"),
                                {"run_id": lease.run_id, "token": lease.token, "seq": after_seq, "data": data})
            if done.rowcount == 0:
                raise RunFencedError(lease.run_id, "save a checkpoint of")
        return True

    def _do_checkpoint(self, run_id: str) -> Optional[SavedCheckpoint]:
        with self._transaction("read a checkpoint") as conn:
            row = self._one(conn, f"SELECT cp_seq, cp_data FROM {{runs}} WHERE {_LIVE}", {"run_id": run_id})
        return None if row is None or row[0] is None or row[1] is None else SavedCheckpoint(int(row[0]), row[1])


class _Listener:
    """The log's one LISTEN connection, on a thread: each notification wakes that run's readers here.

    Started by the first read that has to wait; a lost connection wakes
    every reader (they look again) and is made anew after a pause.
    """

    _TICK_S = 0.25  # how soon stop() is noticed

    def __init__(self, log: PostgresRunLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> bool:
        """Start the thread if it is not running; whether this call started it (after LISTEN took effect)."""
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                return False
            self._thread = threading.Thread(target=self._run, name="streamengine-runs-listen", daemon=True)
            self._thread.start()
        self._listening.wait(self._log._timeout_s)
        return True

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(self._log._timeout_s + 2 * self._TICK_S)

    def _run(self) -> None:
        psycopg = self._log._psycopg
        while not self._stopping.is_set():
            try:
                with self._log.connect(autocommit=True) as conn:
                    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._log.table)))
                    self._listening.set()
                    while not self._stopping.is_set():
                        for notify in conn.notifies(timeout=self._TICK_S):
                            self._log._waker.wake(notify.payload)
            except psycopg.Error:
                self._log._waker.wake_all()
                self._stopping.wait(1.0)
