"""Per-request tool dispatch: the gate every completed call passes, in order.

dedup → per-round and per-request caps → allowlist / unknown tool → start.
A call that fails a gate is not dropped silently: it becomes an error
:class:`ToolResult` that the continuation reports to the model, and a counter
in the telemetry.  Tools with side effects wait at the last gate until the
round's stream has finished normally (see :meth:`ToolDispatcher.release_side_effects`).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Set, Tuple, Union

from .errors import ToolError
from .messages import ToolCall, ToolResult
from .tools import Tool, ToolExecutor, ToolHandle, ToolRegistry


@dataclass
class DispatchCounters:
    """How many calls each gate let through or stopped, for the run's telemetry."""

    tools_started: int = 0
    dedup_skipped: int = 0
    cap_skipped: int = 0
    disallowed: int = 0
    parse_errors: int = 0


@dataclass
class DispatchLimits:
    """The engine's caps; ``tool_timeout`` is the default for tools without their own."""

    max_tools_per_round: int
    max_tools_total: int
    tool_timeout: float
    allowed_tools: Optional[frozenset]


Entry = Union[ToolHandle, ToolResult]



def canonical_key(call: ToolCall) -> Tuple[str, str]:
    """Same name and same arguments (key order and spacing aside) = same call."""
    return call.name, json.dumps(call.args(), sort_keys=True, separators=(",", ":"))


class ToolDispatcher:
    """Owns the tool calls of one request; not shared between requests.

    ``on_start`` is called (in the dispatching thread) right before a tool is
    submitted, so that the ``tool_start`` event precedes anything the tool does.
    """

    def __init__(self, registry: ToolRegistry, executor: ToolExecutor, limits: DispatchLimits,
                 cancel: threading.Event, on_start: Callable[[ToolCall], None],
                 on_result: Optional[Callable[[ToolResult], None]] = None) -> None:
        self._registry = registry
        self._executor = executor
        self._limits = limits
        self._cancel = cancel
        self._on_start = on_start
        self._on_result = on_result
        self._settled: List[threading.Event] = []
        self._seen: Set[Tuple[str, str]] = set()
        self._total = 0
        self.counters = DispatchCounters()
        self.begin_round()

    # --- per round -------------------------------------------------------
    def begin_round(self, *, accept_calls: bool = True) -> None:
        self._round: List[Entry] = []  # one entry per call found this round, in order
        self._round_count = 0
        self._gated: List[Tuple[int, Tool, ToolCall]] = []
        self._round_keys: List[Tuple[str, str]] = []
        self.round_closed = not accept_calls
        self._counters_at_round_start = DispatchCounters(**vars(self.counters))

    def reset_round(self) -> None:
        """Forget an attempt that failed before any tool started, so failover starts clean."""
        assert not self.started_any, "a round that started tools cannot be replayed"
        self._seen.difference_update(self._round_keys)
        self._total -= self._round_count
        self.counters = DispatchCounters(**vars(self._counters_at_round_start))
        self.begin_round(accept_calls=not self.round_closed)

    @property
    def found_calls(self) -> bool:
        return bool(self._round)

    @property
    def started_any(self) -> bool:
        return any(isinstance(e, ToolHandle) for e in self._round)

    def dispatch(self, call: ToolCall) -> None:
        """Run the gates for one completed call; start it unless a gate stops it."""
        if self.round_closed:
            self.counters.cap_skipped += 1
            self._refuse(call, f"skipped: no continuation left to use the result of '{call.name}'; "
                               f"answer without it")
            return
        try:
            key = canonical_key(call)
        except ToolError as exc:
            self.counters.parse_errors += 1
            self._refuse(call, f"invalid arguments: {exc}")
            return
        if key in self._seen:
            self.counters.dedup_skipped += 1
            self._refuse(call, f"skipped: duplicate of an earlier call to '{call.name}' with the same "
                               f"arguments; use its result")
            return
        self._seen.add(key)
        self._round_keys.append(key)
        if self._round_count >= self._limits.max_tools_per_round or self._total >= self._limits.max_tools_total:
            self.counters.cap_skipped += 1
            self._refuse(call, self._cap_reason(call))
            return
        tool = self._registry.get(call.name)
        allowed = self._limits.allowed_tools
        if tool is None or (allowed is not None and call.name not in allowed):
            self.counters.disallowed += 1
            self._refuse(call, self._unavailable_reason(call))
            return
        self._round_count += 1
        self._total += 1
        if tool.side_effects:
            self._gated.append((len(self._round), tool, call))
            self._refuse(call, "not run: the stream did not finish normally, so a tool with side "
                               "effects was not started")
            return
        self._start(len(self._round), tool, call, append=True)

    def _refuse(self, call: ToolCall, reason: str) -> None:
        """The call's slot holds an error result: it never ran (``started_at`` stays 0.0)."""
        self._round.append(ToolResult.error_result(call, reason))

    def _start(self, slot: int, tool: Tool, call: ToolCall, *, append: bool) -> None:
        self.counters.tools_started += 1
        self._on_start(call)
        # The engine's default; a tool's own @tool(timeout=...) wins, decided in ToolExecutor.submit.
        handle = self._executor.submit(tool, call, self._limits.tool_timeout, cancel=self._cancel)
        if self._on_result is not None:
            self._watch_result(handle)
        if append:
            self._round.append(handle)
        else:
            self._round[slot] = handle

    def _watch_result(self, handle: ToolHandle) -> None:
        """Hand each result to ``on_result`` on the worker that produced it, the moment it is fixed."""
        settled = threading.Event()
        self._settled.append(settled)
        on_result = self._on_result
        assert on_result is not None

        def deliver(done: ToolHandle) -> None:
            try:
                on_result(done.result())
            finally:
                settled.set()

        handle.add_done_callback(deliver)

    def wait_for_results_delivered(self, timeout: float) -> bool:
        """Block until every ``on_result`` of this request has returned (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        return all(ev.wait(max(0.0, deadline - time.monotonic())) for ev in self._settled)

    def release_side_effects(self) -> None:
        """The stream finished normally: start the side-effect tools held back."""
        gated, self._gated = self._gated, []
        for slot, tool, call in gated:
            self._start(slot, tool, call, append=False)

    def cancel_all(self) -> None:
        for entry in self._round:
            if isinstance(entry, ToolHandle):
                entry.cancel()

    def entries(self) -> Sequence[Entry]:
        return list(self._round)

    # --- messages ----------------------------------------------------------
    def _cap_reason(self, call: ToolCall) -> str:
        if self._total >= self._limits.max_tools_total:
            return (f"skipped: the limit of {self._limits.max_tools_total} tool calls per request "
                    f"was reached; answer with what you have")
        return (f"skipped: the limit of {self._limits.max_tools_per_round} tool calls per round "
                f"was reached; call '{call.name}' again next round only if it is still needed")

    def _unavailable_reason(self, call: ToolCall) -> str:
        names = sorted(self.available_names())
        listing = ", ".join(names) if names else "none"
        return f"tool '{call.name}' is not available; available tools: {listing}"

    def available_names(self) -> List[str]:
        allowed = self._limits.allowed_tools
        return [n for n in self._registry.names if allowed is None or n in allowed]
