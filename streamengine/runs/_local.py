"""The runs this process is producing, so a graceful shutdown ends each with a terminal event, not a lost lease.

A worker that is told to stop (SIGTERM, a gunicorn ``max_requests``
restart) calls :func:`shutdown_runs`: every local producer is asked to end
its run with ``error{code: worker_shutdown}`` (or ``done``, if it gets there
first) and waited for; one that does not end in time has its terminal
written from the calling thread, so its readers are told at once instead of
after ``lease_s``.  Producers register here (the web layer's), this module
knows them only by :class:`LocalProducer`.
"""
from __future__ import annotations

import json
import threading
import time
from typing import List, Protocol, Set

from .. import _validation as validation
from ._contract import Event

#: The terminal a producer that is shut down writes.
WORKER_SHUTDOWN = "worker_shutdown"


def shutdown_event() -> Event:
    """``error{fatal, code: worker_shutdown}``: the worker stopped before the run ended; ask again."""
    return "error", json.dumps({"message": "the worker producing this run is shutting down; ask again",
                                "fatal": True, "code": WORKER_SHUTDOWN})


class LocalProducer(Protocol):
    """What :func:`shutdown_runs` needs of a producer in this process."""

    def shut_down(self) -> None:
        """Cancel the run and end it with ``worker_shutdown``, from the thread driving it (returns at once)."""

    def wait_ended(self, timeout_s: float) -> bool:
        """Until the run has its terminal event (written by this producer or fenced off); whether it has."""

    def force_end(self) -> None:
        """Write the ``worker_shutdown`` terminal from this thread (the driving thread is then fenced)."""


_lock = threading.Lock()
_producers: Set[LocalProducer] = set()


def register(producer: LocalProducer) -> None:
    with _lock:
        _producers.add(producer)


def unregister(producer: LocalProducer) -> None:
    with _lock:
        _producers.discard(producer)


def local_runs() -> int:
    """How many runs this process is producing now (attached or detached)."""
    with _lock:
        return len(_producers)


def shutdown_runs(timeout_s: float = 10.0) -> int:
    """End every run this process produces within ``timeout_s``: ``done``, or ``error{worker_shutdown}``.

    Call it when the worker is told to stop (``streamengine serve`` does on
    SIGTERM; docs/deployment.md shows the gunicorn hook).  Returns how many
    runs were still going when it was called.
    """
    timeout_s = validation.seconds(timeout_s, "timeout_s (how long shutdown_runs waits for runs to end)")
    with _lock:
        producers: List[LocalProducer] = list(_producers)
    for producer in producers:
        producer.shut_down()
    deadline = time.monotonic() + timeout_s * 0.8  # the rest of the time for the forced ends
    for producer in producers:
        if not producer.wait_ended(max(0.0, deadline - time.monotonic())):
            producer.force_end()
    return len(producers)
