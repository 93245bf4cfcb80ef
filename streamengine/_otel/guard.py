"""Telemetry never breaks a run: every call into OpenTelemetry is guarded, and a failure is logged once.

An SDK runs the application's own code inside the engine's calls: span
processors in ``start_span`` and ``end``, exemplar filters and views in
``record``.  A bug there raised into the run (a tool's result lost, a run
ended ``internal_error``, ``run()`` failing before its first event).  So the
engine's hooks run under a :class:`Guard`: what raises is logged (once per
engine for each place and exception type, never per chunk or per span) and
the run goes on with what telemetry it still has.
"""
from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Optional, Set, Tuple, Type

from .._logs import component_logger

_log = component_logger("streamengine.otel")


class Guard:
    """One per engine: ``with guard("ending a chat span"): ...`` runs the block, swallowing and telling errors."""

    def __init__(self) -> None:
        self._told: Set[Tuple[str, type]] = set()
        self._lock = threading.Lock()

    def __call__(self, where: str) -> _Guarded:
        return _Guarded(self, where)

    def failed(self, where: str, exc: Exception) -> None:
        """Log ``exc`` the first time this place fails with this type; later ones are only swallowed."""
        key = (where, type(exc))
        with self._lock:
            if key in self._told:
                return
            self._told.add(key)
        _log.opt(exception=exc).warning(
            "OpenTelemetry failed while {} ({}: {}); the run goes on, its telemetry may be incomplete. "
            "Fix the span processor, exporter, view or exemplar filter that raised; this is logged once",
            where, type(exc).__name__, exc)


class _Guarded:
    """The context of one guarded block (a class, not a generator: it is entered per span, not per chunk)."""

    __slots__ = ("guard", "where")

    def __init__(self, guard: Guard, where: str) -> None:
        self.guard = guard
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> bool:
        if isinstance(exc, Exception):  # never a KeyboardInterrupt or a generator's exit
            self.guard.failed(self.where, exc)
            return True
        return False


class GuardedHistogram:
    """A histogram whose ``record`` cannot raise into the run (an exemplar filter or view may)."""

    __slots__ = ("_guard", "_histogram")

    def __init__(self, histogram: Any, guard: Guard) -> None:
        self._histogram = histogram
        self._guard = guard

    def record(self, amount: float, attributes: Any = None) -> None:
        try:
            self._histogram.record(amount, attributes)
        except Exception as exc:  # one place for every histogram: what breaks one breaks them all
            self._guard.failed("recording a metric", exc)
