"""Runs that outlive their connection: an append-only event log per run, on a store several workers share.

``MemoryRunLog()`` keeps runs in this process; ``SqliteRunLog(path)`` shares
them between processes of one host; ``RedisRunLog(url)`` and
``PostgresRunLog(dsn)`` between hosts.  docs/runs.md states the contract.
"""
from ._contract import (
    FINISH_STATES,
    LOST,
    RUNNING,
    TERMINAL_STATES,
    ApprovalAnswer,
    Frame,
    Gap,
    Lease,
    RunExistsError,
    RunFencedError,
    RunLog,
    RunLogError,
    RunNotFound,
    RunStatus,
    new_run_id,
)
from ._memory import MemoryRunLog
from ._postgres import PostgresRunLog
from ._redis import RedisRunLog
from ._sqlite import SqliteRunLog

__all__ = [
    "FINISH_STATES",
    "LOST",
    "RUNNING",
    "TERMINAL_STATES",
    "ApprovalAnswer",
    "Frame",
    "Gap",
    "Lease",
    "MemoryRunLog",
    "PostgresRunLog",
    "RedisRunLog",
    "RunExistsError",
    "RunFencedError",
    "RunLog",
    "RunLogError",
    "RunNotFound",
    "RunStatus",
    "SqliteRunLog",
    "new_run_id",
]
