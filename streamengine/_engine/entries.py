"""What a round holds for each call it found, and how a started call says it was told.

An entry is a fixed :class:`ToolResult` (a gate stopped the call), a running
:class:`ToolHandle`, or a :class:`Reused` handle (a replayed round's call,
answered by the handle its failed attempt started).  A started call's
:class:`Report` is set once its result has been told: what the round waits for.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Union

from .._cancel import no_callback
from .._messages import ToolCall, ToolResult
from ..tools import ToolHandle

#: A run given up on waits at most this long for a result fixed just before to be told.
REPORT_GRACE_S = 0.05


class Report:
    """Set once a started call's ``on_result`` returned: its ``tool_result`` is out, counted and queued for filing.

    A round must wait for this, not for the handle: a handle is done the
    moment its result is fixed, before its done callbacks run, and a round
    that went on then could end the run while the worker was still telling
    the result (a ``tool_result`` lost or after ``done``, telemetry short).
    ``wake`` is set by whoever waits for it from another thread (the run's loop).
    """

    __slots__ = ("_told", "is_set", "wait", "wake")

    def __init__(self) -> None:
        self._told = threading.Event()
        # The event's own methods: a wait whose ``ready`` is ``is_set`` holds the event, not
        # this report, which holds that wait's ``wake`` (no cycle for the collector).
        self.is_set: Callable[[], bool] = self._told.is_set
        self.wait: Callable[[float], bool] = self._told.wait
        self.wake: Callable[[], None] = no_callback

    def set(self) -> None:
        self._told.set()
        self.wake()


@dataclass
class Reused:
    """A call of a replayed round answered by the handle its first attempt started."""

    handle: ToolHandle
    call: ToolCall

    def result(self) -> ToolResult:
        return dataclasses.replace(self.handle.result(), call_id=self.call.id)


Entry = Union[ToolHandle, ToolResult, Reused]


def entry_handle(entry: Entry) -> Optional[ToolHandle]:
    """The running call behind an entry, if any."""
    if isinstance(entry, Reused):
        return entry.handle
    return entry if isinstance(entry, ToolHandle) else None


def entry_result(entry: Entry) -> ToolResult:
    """The entry's result; blocks (up to the tool's deadline) for a running call."""
    return entry if isinstance(entry, ToolResult) else entry.result()
