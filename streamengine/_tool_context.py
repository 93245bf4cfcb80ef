"""What a running tool may look at to stop early: :class:`ToolContext`.

Its own module because it is the one piece of tool data with behaviour
(clocks, a cancel event, pickling across processes); the plain records a
call produces (:class:`~streamengine._messages.ToolResult`) stay with the
other data in ``_messages``.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

from ._errors import ToolError


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may look at to stop early.

    Declare a parameter annotated ``ToolContext`` (any name) to receive it; it
    is injected, never shown to the model.  ``cancelled`` turns true when the
    call is cancelled *or* its deadline has passed, so a polling loop stops on
    time even before anyone has noticed the timeout.
    """

    cancel_event: threading.Event = field(default_factory=threading.Event)
    deadline: Optional[float] = None  # time.monotonic() value; None = no deadline

    def __reduce__(self) -> Tuple[Any, Tuple[Optional[float]]]:
        """Pickle for a tool in another process: the deadline as wall-clock time, no cancel event.

        Monotonic clocks of two processes (or machines) share no origin; the
        epoch does.  An Event cannot cross processes: the remote side gets a
        fresh one, so there ``cancelled`` turns true at the deadline only.
        """
        return _context_at_wall_clock, (self.deadline_epoch,)

    @property
    def deadline_epoch(self) -> Optional[float]:
        """The deadline as ``time.time()`` seconds (None without one)."""
        if self.deadline is None:
            return None
        return time.time() + (self.deadline - time.monotonic())

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative; ``inf`` without one)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise :class:`ToolError` if the tool should stop now."""
        if self.cancel_event.is_set():
            raise ToolError("cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise ToolError("cancelled: deadline passed")

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return False at once if cancelled or past the deadline."""
        wait_s = min(max(0.0, seconds), self.remaining())
        if self.cancel_event.wait(wait_s if wait_s != math.inf else None):
            return False
        return not self.cancelled


def _context_at_wall_clock(deadline_epoch: Optional[float]) -> ToolContext:
    """Unpickle a :class:`ToolContext`: the wall-clock deadline back on this process's monotonic clock."""
    if deadline_epoch is None:
        return ToolContext()
    return ToolContext(threading.Event(), time.monotonic() + (deadline_epoch - time.time()))

