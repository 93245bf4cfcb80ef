"""Per-request tool dispatch: the gate every completed call passes, in order.

dedup → per-round and per-request caps → allowlist / unknown tool → start.
The order is the same in every round, the last included: a call in the last
round still runs (its result is shown and filed), there is just no
continuation to read it.  A call that fails a gate is not dropped silently:
it becomes an error :class:`ToolResult` that the continuation reports to the
model, and a counter in the telemetry.

Dedup remembers only calls that were *started*: a call skipped by a cap, a
side-effect call held back on a stream that broke, or one the pool was too
busy to start has no result, so the model may ask for it again.  Tools with
side effects wait at the last gate until the round's stream has finished
normally, then run only if ``approve`` says yes: without one they are refused.

Results are reported the moment they exist, exactly once per call:
``on_result(result, skipped)`` runs in the thread that fixed the result -- the
worker when the tool returned, the thread that noticed a deadline, queue limit
or cancel, or at once for a call a gate stopped.  ``skipped`` says why a call
never ran (:data:`GATE_SKIPS`, or the pool's ``pool_busy``/``cancelled``), None
for one that ran.  A started call's report (:meth:`ToolDispatcher.report_of`) is set
once its ``on_result`` has returned: what the round waits for, since a
handle is done (its result fixed) before its ``on_result`` has run.

Call ids are the run's: a call's id is kept when it is new in the run, and a
repeated one is renamed ``dup_2``, ``dup_3``, ... for the run (events,
results, filing).  An inline call that comes after a native call with its id
is the one renamed; a native call keeps the provider's id on the wire
(``RoundStream.wire_ids``) unless its own answer repeats it, so the provider
sees each of its calls answered under the id it gave.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .._clients.base import Flag
from .._errors import ToolError
from .._messages import ToolCall, ToolResult
from ..tools import Tool, ToolExecutor, ToolHandle, ToolRegistry
from .entries import Entry, Reused, entry_handle
from .result import Telemetry

Key = Tuple[str, str]
Approve = Callable[[ToolCall], object]
OnResult = Callable[[ToolResult, Optional[str]], object]

#: Skip reasons of calls a gate stopped: they never reached the pool, so they are no tool outcome
#: (``tools_ok``/``failed``/``timed_out``); the pool's own are ``pool_busy`` and ``cancelled``.
GATE_SKIPS = frozenset({"invalid", "duplicate", "round_cap", "request_cap", "not_allowed", "not_approved"})


#: Calls a gate stopped (caps, duplicates, unknown tools, unreadable) that are told one by one
#: per round; past it they are only counted and summed up in one line (5,000 blocks in an
#: answer must not become 5,000 events and a megabyte of continuation).
MAX_TOLD_STOPPED = 10

#: The :class:`Telemetry` counters the gates write (on the run thread); a failover replay rewinds them.
GATE_COUNTERS = ("tools_started", "dedup_skipped", "cap_skipped", "disallowed", "parse_errors", "refused")
_gate_counters = operator.attrgetter(*GATE_COUNTERS)  # their values, as a tuple in GATE_COUNTERS' order


@dataclass
class DispatchLimits:
    """The engine's caps; ``tool_timeout`` is the default for tools without their own."""

    max_tools_per_round: int
    max_tools_total: int
    tool_timeout: float
    allowed_tools: Optional[frozenset]


def canonical_key(call: ToolCall) -> Key:
    """Same name and same arguments (key order and spacing aside) = same call."""
    return call.name, json.dumps(call.args(), sort_keys=True, separators=(",", ":"))


class ToolDispatcher:
    """Owns the tool calls of one request; not shared between requests.

    ``on_start(call)`` runs when the tool's function is entered (on its
    worker), so ``tool_start`` never precedes a wait in the pool's queue.
    ``on_result(result, skipped)`` runs once per call the moment its result is
    fixed; ``skipped`` is why it never ran (None: it ran).
    The gates count into ``telemetry`` (the run's one counter record).
    ``tools`` overrides registry entries for this run only (``rag_search``
    bound to the run's scope).
    """

    def __init__(self, registry: ToolRegistry, executor: ToolExecutor, limits: DispatchLimits,
                 cancel: threading.Event, on_start: Callable[[ToolCall], None],
                 on_result: OnResult, approve: Optional[Approve] = None,
                 telemetry: Optional[Telemetry] = None, tools: Optional[Dict[str, Tool]] = None,
                 log: Any = None) -> None:
        self._registry = registry
        self._run_tools = dict(tools or {})
        self._executor = executor
        self._limits = limits
        self._cancel = cancel
        self._on_start = on_start
        self._on_result = on_result
        self._approve = approve
        self._log = log
        self._owner = object()  # this request, for the pool's fair share
        self._started: Dict[Key, ToolHandle] = {}
        self._replayable: Dict[Key, ToolHandle] = {}
        self._ids: Set[str] = set()  # every call id of the run so far
        self._reports: Dict[ToolHandle, Flag] = {}  # every started call's, for the run (a replay reuses them)
        self._total = 0
        #: Started calls whose result may not be fixed yet; one list for the run (changed in place), so
        #: the run's loop looks at it directly and asks for tool deadlines only while it is non-empty.
        self.pending: List[ToolHandle] = []
        self._next_deadline = float("inf")
        self._deadlines_moved = False  # a call started since _next_deadline was taken
        self.counters = telemetry if telemetry is not None else Telemetry()
        self.begin_round()

    # --- per round -------------------------------------------------------
    def begin_round(self) -> None:
        self._round: List[Entry] = []  # one entry per call found this round, in order
        self._round_count = 0
        self._held: List[Tuple[int, Key, Tool, ToolCall]] = []
        self._round_started: Dict[Key, ToolHandle] = {}
        self.untold_stopped = 0  # stopped calls past MAX_TOLD_STOPPED this round: counted, not told
        self._told_stopped = 0
        self._counters_at_round_start = _gate_counters(self.counters)  # one C call: begin_round runs per round
        self._total_at_round_start = self._total

    def reset_round(self) -> None:
        """Forget the round's attempt so failover can stream the round again on another model.

        Tools the attempt started keep running: a call with the same name
        and arguments in the replay reuses its result instead of running twice.
        The attempt's ids stay taken: its calls were told (``tool_start``,
        ``tool_result``) under them, and a different call of the replay must not
        pass for one of them (:meth:`own_id`; an exact repeat, :meth:`_reusing`).
        """
        for key, handle in self._round_started.items():
            self._started.pop(key, None)
            self._replayable[key] = handle
        self._total = self._total_at_round_start
        for name, value in zip(GATE_COUNTERS, self._counters_at_round_start):
            setattr(self.counters, name, value)
        self.begin_round()

    @property
    def found_calls(self) -> bool:
        return bool(self._round)

    @property
    def started_any(self) -> bool:
        return bool(self._round_started)

    def own_id(self, call: ToolCall) -> ToolCall:
        """The call under an id no other call of the run has: its own, or its own plus ``_2``, ``_3``, ..."""
        wanted, n = call.id, 1
        while call.id in self._ids:
            n += 1
            call = dataclasses.replace(call, id=f"{wanted}_{n}")
        self._ids.add(call.id)
        return call

    def dispatch(self, call: ToolCall) -> Optional[ToolCall]:
        """Run the gates for one completed call; start it unless a gate stops it.

        Returns the call under the id the run knows it by (see :meth:`own_id`):
        a native call must be sent back to the provider under that id.  None:
        the call was stopped past ``MAX_TOLD_STOPPED`` and is only summed up.
        """
        wanted = call.id
        call = self.own_id(call)
        untold = self.untold_stopped
        call = self._gate(call, wanted)
        return call if self.untold_stopped == untold else None

    def _gate(self, call: ToolCall, wanted: str) -> ToolCall:
        """The gates in order; returns the call under its final id (see :meth:`_reusing`)."""
        try:
            key = canonical_key(call)
        except ToolError as exc:
            self.counters.parse_errors += 1
            self._settle_now(call, f"invalid arguments for tool '{call.name}': {exc}", "invalid")
            return call
        if self._is_duplicate(key):
            self.counters.dedup_skipped += 1
            self._settle_now(call, f"skipped: duplicate of an earlier call to '{call.name}' "
                                   f"with the same arguments; use its result", "duplicate")
            return call
        if self._round_count >= self._limits.max_tools_per_round or self._total >= self._limits.max_tools_total:
            self.counters.cap_skipped += 1
            self._settle_now(call, *self._cap_reason(call))
            return call
        tool = self._run_tools.get(call.name) or self._registry.get(call.name)
        allowed = self._limits.allowed_tools
        if tool is None or (allowed is not None and call.name not in allowed):
            self.counters.disallowed += 1
            self._settle_now(call, self._unavailable_reason(call), "not_allowed")
            return call
        self._round_count += 1
        self._total += 1
        if tool.side_effects:
            self._held.append((len(self._round), key, tool, call))
            self._round.append(ToolResult.error_result(call, "held: waiting for the stream to finish"))
            return call
        entry = self._start(key, tool, call)
        if isinstance(entry, Reused):
            entry = self._reusing(entry, wanted)
        self._round.append(entry)
        return entry.call if isinstance(entry, Reused) else call

    def _is_duplicate(self, key: Key) -> bool:
        """Asked before in the run and started (or held this round); a call the pool refused as busy never was."""
        started = self._started.get(key)
        if started is not None and started.skipped == "pool_busy":
            del self._started[key]  # its retry runs
            started = None
        return started is not None or any(key == held[1] for held in self._held)

    def _reusing(self, entry: Reused, wanted: str) -> Reused:
        """A replay's call answered by its failed attempt's: an exact repeat (same id too) keeps that id.

        The attempt's ids stay taken (:meth:`reset_round`), so :meth:`own_id` renamed
        it; but its result was told under the attempt's id, which is its own.
        """
        if entry.handle.call.id != wanted or entry.call.id == wanted:
            return entry
        self._ids.discard(entry.call.id)
        return Reused(entry.handle, dataclasses.replace(entry.call, id=wanted))

    def reject(self, call: ToolCall, reason: str) -> None:
        """A block the model wrote but that cannot be a call (the scanner counted it): the model reads why."""
        self._settle_now(self.own_id(call), reason, "invalid")

    def _settle_now(self, call: ToolCall, reason: str, skipped: str) -> None:
        if self._told_stopped >= MAX_TOLD_STOPPED:
            self.untold_stopped += 1
            return
        self._told_stopped += 1
        result = ToolResult.error_result(call, reason)
        self._round.append(result)
        self._on_result(result, skipped)

    def _start(self, key: Key, tool: Tool, call: ToolCall) -> Entry:
        reused = self._replayable.pop(key, None)
        if reused is not None and reused.skipped != "pool_busy":  # a busy refusal is not a result to reuse
            self._started[key] = self._round_started[key] = reused
            return Reused(reused, call)
        self.counters.tools_started += 1
        report = Flag()
        on_result = self._on_result

        def deliver(done: ToolHandle) -> None:
            try:
                on_result(done.result(), done.skipped)
            finally:
                report.set()

        # The tool's own timeout wins over the engine default: that rule lives in ToolExecutor.submit.
        handle = self._executor.submit(tool, call, self._limits.tool_timeout, cancel=self._cancel,
                                       on_start=self._entered, owner=self._owner)
        # Registered at submit, whatever fixes the result (return, deadline, busy
        # refusal, cancel, refusal at submit): each call is told exactly once.
        self._reports[handle] = report  # before the callback: a call refused at submit is told in it at once
        handle.add_done_callback(deliver)
        self._started[key] = self._round_started[key] = handle
        self.pending.append(handle)
        self._next_deadline = min(self._next_deadline, handle.next_limit)
        return handle

    def _entered(self, handle: ToolHandle) -> None:
        """On the worker, as the tool's function is entered."""
        self._deadlines_moved = True  # its deadline now counts from the start, not the queue limit
        self._on_start(handle.call)

    def next_deadline(self) -> float:
        """When the earliest pending call's result may be fixed by its limit (monotonic; inf: none).

        A call's limit moves when it starts (queue limit -> start + timeout),
        so it is taken again after any start: a tool's timeout fires at its
        deadline whether or not it waited in the queue first.
        """
        if self._deadlines_moved:
            self._deadlines_moved = False
            self._next_deadline = min((h.next_limit for h in self.pending), default=float("inf"))
        return self._next_deadline

    def poll_deadlines(self) -> None:
        """Fix the result of a call whose deadline passed, so its ``tool_result`` goes out now.

        Cheap enough for every wait: one clock read while a call is pending.
        """
        if not self.pending or time.monotonic() < self.next_deadline():
            return
        still = [handle for handle in self.pending if not handle.done()]  # done() fixes a lapsed result
        self.pending[:] = still
        self._next_deadline = min((h.next_limit for h in still), default=float("inf"))

    def report_of(self, handle: ToolHandle) -> Flag:
        """Set once the call's ``on_result`` returned: its ``tool_result`` is out, counted, queued for filing.

        For a call this dispatcher started, in this round or (reused) in an earlier
        attempt.  A round waits for this, not for the handle: a handle is done the
        moment its result is fixed, before its done callbacks run, and a round that
        went on then could end the run while the worker was still telling the result.
        """
        return self._reports[handle]

    @property
    def holds_calls(self) -> bool:
        """Side-effect calls wait for the stream's end (and ``approve``)."""
        return bool(self._held)

    def release_side_effects(self) -> None:
        """The stream finished normally: start the side-effect tools held back that ``approve`` says yes to."""
        held, self._held = self._held, []
        for slot, key, tool, call in held:
            refusal = self._refusal(call)
            if refusal is not None:
                self.counters.refused += 1
                self._settle_held(slot, call, refusal)
                continue
            self._round[slot] = self._start(key, tool, call)

    def drop_held(self) -> None:
        """The stream broke: held side-effect calls never run, nor are they asked about (the model may ask again)."""
        held, self._held = self._held, []
        for slot, _key, _tool, call in held:
            self._settle_held(slot, call, "not run: the stream did not finish normally, so a tool with side "
                                          "effects was not started")

    def _settle_held(self, slot: int, call: ToolCall, reason: str) -> None:
        """A held call that will not run: its error result takes its slot, and is told at once."""
        result = ToolResult.error_result(call, reason)
        self._round[slot] = result
        self._on_result(result, "not_approved")

    def _refusal(self, call: ToolCall) -> Optional[str]:
        """Why ``call`` may not run, or None: only an ``approve`` that returns True lets it.

        A hook that raises refuses; its exception goes to the log, not to the model.
        """
        if self._approve is None:
            return (f"not run: '{call.name}' has side effects and nothing approved it; do not retry it, "
                    "answer without it")
        try:
            approved = self._approve(call)
        except Exception as exc:
            if self._log is not None:
                self._log.opt(exception=exc).warning("approval of tool {!r} (call {}) raised, so the call is "
                                                     "refused: {}", call.name, call.id, exc)
            return f"not run: the approval check for '{call.name}' failed; do not retry it, answer without it"
        if approved is True:
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
    def _cap_reason(self, call: ToolCall) -> Tuple[str, str]:
        if self._total >= self._limits.max_tools_total:
            return (f"skipped: the limit of {self._limits.max_tools_total} tool calls per request "
                    f"was reached; answer with what you have"), "request_cap"
        return (f"skipped: the limit of {self._limits.max_tools_per_round} tool calls per round "
                f"was reached; call '{call.name}' again next round only if it is still needed"), "round_cap"

    def _unavailable_reason(self, call: ToolCall) -> str:
        names = sorted(self.available_names())
        listing = ", ".join(names) if names else "none"
        return f"tool '{call.name}' is not available; available tools: {listing}"

    def untold_summary(self) -> str:
        """The one line that stands for this round's calls stopped past ``MAX_TOLD_STOPPED``."""
        return (f"{self.untold_stopped} more tool calls of this round were not run (limits, duplicates or "
                f"unreadable blocks); they are counted, not told one by one")

    def available_names(self) -> List[str]:
        allowed = self._limits.allowed_tools
        return [n for n in self._registry.names if allowed is None or n in allowed]
