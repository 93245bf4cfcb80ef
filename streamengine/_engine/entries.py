"""What a round holds for each call it found, and how long it waits for a result to be told.

An entry is a fixed :class:`ToolResult` (a gate stopped the call), a running
:class:`ToolHandle`, or a :class:`Reused` handle (a replayed round's call,
answered by the handle its failed attempt started).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from .._messages import ToolCall, ToolResult
from ..tools import ToolHandle

#: A run given up on waits at most this long for a result fixed just before to be told (its report).
REPORT_GRACE_S = 0.05


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
