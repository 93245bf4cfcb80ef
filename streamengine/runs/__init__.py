"""Runs that outlive their connection: an append-only event log per run, on a store several workers share.

``MemoryRunLog()`` keeps runs in this process; ``SqliteRunLog(path)`` shares
them between the processes of one host; ``RedisRunLog(url)`` and
``PostgresRunLog(dsn)`` between hosts.  docs/runs.md states the contract.

- ``_contract``: :class:`RunLog` (the contract, its argument checks), the
  records (:class:`Lease`, :class:`Frame`, :class:`Gap`, :class:`RunStatus`,
  :class:`ApprovalAnswer`, :class:`Appended`, :class:`SavedCheckpoint`), the errors, and the trim and wake-up
  helpers the logs share;
- ``_memory``, ``_sqlite``, ``_redis``, ``_postgres``: one log each (redis-py and
  psycopg are imported only when their log is made); ``_open``: a log from a URL;
- ``_group_commit``: the appends of many producers written in one round trip (Redis);
- ``_local``: the runs this process produces, ended by :func:`shutdown_runs`.

Layering: this package depends only on ``_errors``, ``_validation``, ``_logs`` (redaction)
and the standard library.
"""
from ._contract import FINISH_STATES as FINISH_STATES
from ._contract import LOST as LOST
from ._contract import RUNNING as RUNNING
from ._contract import TERMINAL_STATES as TERMINAL_STATES
from ._contract import Appended as Appended
from ._contract import ApprovalAnswer as ApprovalAnswer
from ._contract import Frame as Frame
from ._contract import Gap as Gap
from ._contract import Lease as Lease
from ._contract import RunExistsError as RunExistsError
from ._contract import RunFencedError as RunFencedError
from ._contract import RunLog as RunLog
from ._contract import RunLogError as RunLogError
from ._contract import RunNotFound as RunNotFound
from ._contract import RunStatus as RunStatus
from ._contract import SavedCheckpoint as SavedCheckpoint
from ._contract import new_run_id as new_run_id
from ._local import shutdown_runs as shutdown_runs
from ._memory import MemoryRunLog as MemoryRunLog
from ._open import open_run_log as open_run_log
from ._postgres import PostgresRunLog as PostgresRunLog
from ._redis import RedisRunLog as RedisRunLog
from ._sqlite import SqliteRunLog as SqliteRunLog

__all__ = [
    "Appended", "ApprovalAnswer", "FINISH_STATES", "Frame", "Gap", "LOST", "Lease", "MemoryRunLog", "PostgresRunLog",
    "RUNNING", "RedisRunLog", "RunExistsError", "RunFencedError", "RunLog", "RunLogError", "RunNotFound", "RunStatus",
    "SavedCheckpoint", "SqliteRunLog", "TERMINAL_STATES", "new_run_id", "open_run_log", "shutdown_runs",
]
