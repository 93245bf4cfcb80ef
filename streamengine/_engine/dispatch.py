"""Per-request tool dispatch: the gate every completed call passes, in order.

dedup → per-round and per-request caps → allowlist / unknown tool → start.
The order is the same in every round, the last included: a call in the last
round still runs (its result is shown and filed), there is just no
continuation to read it.  A call that fails a gate is not dropped silently:
it becomes an error :class:`ToolResult` that the continuation reports to the
model, and a counter in the telemetry.

Dedup remembers only calls that were *started*: a call skipped by a cap, or
a side-effect call held back on a stream that broke, has no result, so the
model may ask for it again.  Tools with side effects wait at the last gate
until the round's stream has finished normally, then pass ``approve`` (when
given) before they run.

Results are reported the moment they exist: ``on_result`` runs on the
worker that produced the result (or, for a call that never ran, at once).
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .._errors import ToolError
from .._messages import ToolCall, ToolResult
from ..tools import Tool, ToolExecutor, ToolHandle, ToolRegistry

Key = Tuple[str, str]
Approve = Callable[[ToolCall], object]


@dataclass
class DispatchCounters:
    """How many calls each gate let through or stopped, for the run's telemetry."""

    tools_started: int = 0
    dedup_skipped: int = 0
    cap_skipped: int = 0
    disallowed: int = 0
    parse_errors: int = 0
    refused: int = 0


@dataclass
class DispatchLimits:
    """The engine's caps; ``tool_timeout`` is the default for tools without their own."""

    max_tools_per_round: int
    max_tools_total: int
    tool_timeout: float
    allowed_tools: Optional[frozenset]


@dataclass
class _Reused:
    """A call of a replayed round answered by the handle its first attempt started."""

    handle: ToolHandle
    call: ToolCall

    def result(self) -> ToolResult:
        return dataclasses.replace(self.handle.result(), call_id=self.call.id)


Entry = Union[ToolHandle, ToolResult, _Reused]


def canonical_key(call: ToolCall) -> Key:
    """Same name and same arguments (key order and spacing aside) = same call."""
    return call.name, json.dumps(call.args(), sort_keys=True, separators=(",", ":"))


def entry_handle(entry: Entry) -> Optional[ToolHandle]:
    """The running call behind an entry, if any."""
    if isinstance(entry, _Reused):
        return entry.handle
    return entry if isinstance(entry, ToolHandle) else None


def entry_result(entry: Entry) -> ToolResult:
    """The entry's result; blocks (up to the tool's deadline) for a running call."""
    return entry if isinstance(entry, ToolResult) else entry.result()


class ToolDispatcher:
    """Owns the tool calls of one request; not shared between requests.

    ``on_start(call)`` runs when the tool's function is entered (on its
    worker), so ``tool_start`` never precedes a wait in the pool's queue.
    ``on_result(result, ran)`` runs once per call the moment its result is
    fixed; ``ran`` is False for a call a gate stopped (it never reached the pool).
    """

    def __init__(self, registry: ToolRegistry, executor: ToolExecutor, limits: DispatchLimits,
                 cancel: threading.Event, on_start: Callable[[ToolCall], None],
                 on_result: Callable[[ToolResult, bool], None], approve: Optional[Approve] = None) -> None:
        self._registry = registry
        self._executor = executor
        self._limits = limits
        self._cancel = cancel
        self._on_start = on_start
        self._on_result = on_result
        self._approve = approve
        self._owner = object()  # this request, for the pool's fair share
        self._reported: List[threading.Event] = []
        self._started: Dict[Key, ToolHandle] = {}
        self._replayable: Dict[Key, ToolHandle] = {}
        self._total = 0
        self._pending: List[ToolHandle] = []  # started, result maybe not fixed yet
        self._never_started: Dict[ToolHandle, Callable[[ToolHandle], None]] = {}
        self._next_deadline = float("inf")
        self.counters = DispatchCounters()
        self.begin_round()

    # --- per round -------------------------------------------------------
    def begin_round(self) -> None:
        self._round: List[Entry] = []  # one entry per call found this round, in order
        self._round_count = 0
        self._held: List[Tuple[int, Key, Tool, ToolCall]] = []
        self._round_started: Dict[Key, ToolHandle] = {}
        self._counters_at_round_start = DispatchCounters(**vars(self.counters))
        self._total_at_round_start = self._total

    def reset_round(self) -> None:
        """Forget the round's attempt so failover can stream the round again on another model.

        Tools the attempt started keep running: a call with the same name
        and arguments in the replay reuses its result instead of running twice.
        """
        for key, handle in self._round_started.items():
            self._started.pop(key, None)
            self._replayable[key] = handle
        self._total = self._total_at_round_start
        self.counters = DispatchCounters(**vars(self._counters_at_round_start))
        self.begin_round()

    @property
    def found_calls(self) -> bool:
        return bool(self._round)

    @property
    def started_any(self) -> bool:
        return bool(self._round_started)

    def dispatch(self, call: ToolCall) -> None:
        """Run the gates for one completed call; start it unless a gate stops it."""
        try:
            key = canonical_key(call)
        except ToolError as exc:
            self.counters.parse_errors += 1
            self._settle_now(call, f"invalid arguments for tool '{call.name}': {exc}")
            return
        if key in self._started or any(key == held[1] for held in self._held):
            self.counters.dedup_skipped += 1
            self._settle_now(call, f"skipped: duplicate of an earlier call to '{call.name}' "
                                   f"with the same arguments; use its result")
            return
        if self._round_count >= self._limits.max_tools_per_round or self._total >= self._limits.max_tools_total:
            self.counters.cap_skipped += 1
            self._settle_now(call, self._cap_reason(call))
            return
        tool = self._registry.get(call.name)
        allowed = self._limits.allowed_tools
        if tool is None or (allowed is not None and call.name not in allowed):
            self.counters.disallowed += 1
            self._settle_now(call, self._unavailable_reason(call))
            return
        self._round_count += 1
        self._total += 1
        if tool.side_effects:
            self._held.append((len(self._round), key, tool, call))
            self._round.append(ToolResult.error_result(call, "held: waiting for the stream to finish"))
            return
        self._round.append(self._start(key, tool, call))

    def reject(self, call: ToolCall, reason: str) -> None:
        """A block the model wrote but that cannot be a call (the scanner counted it): the model reads why."""
        self._settle_now(call, reason)

    def _settle_now(self, call: ToolCall, reason: str) -> None:
        result = ToolResult.error_result(call, reason)
        self._round.append(result)
        self._on_result(result, False)

    def _start(self, key: Key, tool: Tool, call: ToolCall) -> Entry:
        reused = self._replayable.pop(key, None)
        if reused is not None:
            self._started[key] = self._round_started[key] = reused
            return _Reused(reused, call)
        self.counters.tools_started += 1
        reported = threading.Event()
        self._reported.append(reported)
        on_result, on_start = self._on_result, self._on_start

        def deliver(done: ToolHandle) -> None:
            try:
                on_result(done.result(), True)
            finally:
                reported.set()

        def entered(handle: ToolHandle) -> None:
            # Registered on the worker as the function is entered, so a result
            # (and its filing) is always delivered there, never on the run thread.
            handle.add_done_callback(deliver)
            on_start(call)

        # The tool's own timeout wins over the engine default: that rule lives in ToolExecutor.submit.
        handle = self._executor.submit(tool, call, self._limits.tool_timeout, cancel=self._cancel, on_start=entered,
                                       owner=self._owner)
        self._never_started[handle] = deliver
        self.settle_unstarted(handle)  # refused at submit (invalid arguments): reported at once
        self._started[key] = self._round_started[key] = handle
        self._pending.append(handle)
        self._next_deadline = min(self._next_deadline, handle.next_limit)
        return handle

    def settle_unstarted(self, handle: ToolHandle) -> None:
        """Report a call whose result was fixed before its function was entered (queue timeout, cancel)."""
        deliver = self._never_started.pop(handle, None)
        if deliver is not None and handle.started_at is None and handle.done():
            deliver(handle)

    def poll_deadlines(self) -> None:
        """Fix the result of a call whose deadline passed, so its ``tool_result`` goes out now.

        Cheap enough for every chunk: one clock read while a call is pending.
        """
        if not self._pending or time.monotonic() < self._next_deadline:
            return
        still = []
        for handle in self._pending:
            if handle.done():
                self.settle_unstarted(handle)
            else:
                still.append(handle)
        self._pending = still
        self._next_deadline = min((h.next_limit for h in still), default=float("inf"))

    def wait_until_reported(self, timeout: float) -> bool:
        """Block until every started call's ``on_result`` has returned (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        return all(ev.wait(max(0.0, deadline - time.monotonic())) for ev in self._reported)

    def release_side_effects(self) -> None:
        """The stream finished normally: ask ``approve``, then start the side-effect tools held back."""
        held, self._held = self._held, []
        for slot, key, tool, call in held:
            refusal = self._refusal(call)
            if refusal is not None:
                self.counters.refused += 1
                refused = ToolResult.error_result(call, refusal)
                self._round[slot] = refused
                self._on_result(refused, False)
                continue
            self._round[slot] = self._start(key, tool, call)

    def drop_held(self) -> None:
        """The stream broke: held side-effect calls never run (and may be asked for again)."""
        held, self._held = self._held, []
        for slot, _key, _tool, call in held:
            dropped = ToolResult.error_result(
                call, "not run: the stream did not finish normally, so a tool with side effects was not started")
            self._round[slot] = dropped
            self._on_result(dropped, False)

    def _refusal(self, call: ToolCall) -> Optional[str]:
        if self._approve is None:
            return None
        try:
            approved = self._approve(call)
        except Exception as exc:
            return f"not run: approval of '{call.name}' failed ({type(exc).__name__}: {exc}); do not retry it"
        if approved:
            return None
        return f"not run: the call to '{call.name}' was not approved; do not retry it, answer without it"

    def cancel_unused_replays(self) -> None:
        """Tools a failed attempt started that its replay did not ask for again: stop them."""
        unused, self._replayable = self._replayable, {}
        for handle in unused.values():
            handle.cancel()

    def cancel_all(self) -> None:
        for entry in self._round:
            handle = entry_handle(entry)
            if handle is not None:
                handle.cancel()

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
