"""Drive a failover call in the test's thread and record each back-off it yields.

A back-off is a :class:`Wait` without a socket: failover yields it before the
next attempt instead of sleeping, so the thread that drives the call keeps its
heartbeats, tool deadlines and cancel while it waits.  The length recorded is
the wait's end as the call set it, less the clock when it was yielded (the same
instant, give or take the microseconds in between).  Unless ``wait_out`` is
set, a recorded back-off is fast-forwarded (its end moved to now), so a test
that only checks what was asked for waits no wall-clock time.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, List, Optional

from streamengine._wait import block_on


class RecordedBackoffs:
    """``waits``: the back-offs of the calls made through :meth:`call`, in seconds (2 decimals)."""

    def __init__(self, wait_out: bool = False, on_backoff: Optional[Callable[[], None]] = None) -> None:
        self.wait_out = wait_out
        self.on_backoff = on_backoff
        self.waits: List[float] = []

    def call(self, failover: Any, messages: Any, **kwargs: Any) -> Any:
        """``failover.stream_call(messages, **kwargs)``, driven here."""
        steps = failover.stream_call(messages, **kwargs)
        seen = set()
        try:
            wait = next(steps)
            while True:
                over = wait.ready is not None and wait.ready()  # a probe for deadlines (over at once)
                if wait.fileobj is None and not over and math.isfinite(wait.until) and wait.until not in seen:
                    self._record(wait)
                    seen.add(wait.until)
                block_on(wait)
                wait = steps.send(None)
        except StopIteration as stop:
            return stop.value

    def _record(self, wait: Any) -> None:
        self.waits.append(round(wait.until - time.monotonic(), 2))
        if self.on_backoff is not None:
            self.on_backoff()
        if not self.wait_out:
            wait.until = time.monotonic()
