"""One run of the engine, round by round, as a generator driven by the thread that iterates the run.

Each round streams the model's answer; visible text goes to the caller as it
arrives while completed tool calls go through the :class:`ToolDispatcher` at
once, and each ``tool_result`` is sent the moment its tool finishes.  After
the stream the round collects its results in call order, and if it found any
call the next round asks the model for a revised answer.

:meth:`RoundRunner.run` does not block on the provider or on a tool: where it
would, it yields a :class:`~streamengine._clients.base.Wait`, and the run's
loop (``loop.RunLoop``) waits for it together with everything else: a
tool's report, a round's filing (bounded by ``filing_timeout``), the model.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, Generator, Iterable, List, Optional, Set

from .._clients.base import Wait
from .._errors import LlmCancelledError, LlmError, LlmOutputLimitError
from .._inline import tool_instructions
from .._messages import LLM_WARNING, Message, ToolCall, ToolResult
from .continuation import continuation_messages
from .dispatch import GATE_SKIPS, DispatchLimits, ToolDispatcher
from .entries import REPORT_GRACE_S, entry_handle, entry_result
from .events import DoneEvent, ErrorEvent, RefusalEvent, ResetEvent, RoundEvent, ToolResultEvent, ToolStartEvent
from .filing import wait_filed
from .result import CUT_OFF_FINISH_REASONS, EngineResult, attempt_failure
from .round_stream import RoundStream
from .run_state import RunDeps, RunState
from .traced import RoundTrace, traced_tool_callbacks

Steps = Generator[Wait, None, Any]
_NEVER = float("inf")


def _joined(parts: Iterable[str]) -> str:
    return "\n\n".join(part for part in parts if part)


class RoundRunner:
    """Runs the rounds of one request; ``run()`` (a generator of waits) ends with a ``DoneEvent``."""

    def __init__(self, deps: RunDeps, state: RunState) -> None:
        self.deps = deps
        self.config = deps.config
        self.state = state
        has_tools = bool(deps.registry.names)
        self.use_inline = has_tools and self.config.uses_inline_tools
        self.use_native = has_tools and self.config.uses_native_tools
        self._lock = threading.Lock()  # telemetry counters and reports written from tool workers
        self._reported: Set[str] = set()  # call ids whose tool_result went out
        self._tickets: Dict[str, Any] = {}  # call id -> its FilingTicket
        self._round_no = 0
        on_start, on_result = self._on_tool_start, self._on_tool_result
        if state.trace is not None:  # OpenTelemetry: each call's span opens at entry and closes at its result
            on_start, on_result = traced_tool_callbacks(state.trace, deps.registry, on_start, on_result)
        self.dispatcher = ToolDispatcher(
            deps.registry, deps.executor,
            DispatchLimits(self.config.max_tools_per_round, self.config.max_tools_total,
                           self.config.tool_timeout, self.config.allowed_tools),  # a frozenset or None
            state.cancel, on_start=on_start, on_result=on_result,
            approve=deps.approve, telemetry=state.telemetry,
            tools=deps.run_tools(state.scope) if deps.run_tools is not None else None, log=deps.log)
        self.messages = self._initial_messages(state.conversation)
        self._parser_errors = 0
        self.output_left = self.config.max_run_output_chars  # spent chunk by chunk by each RoundStream

    # --- set-up -------------------------------------------------------------------
    def _tool_specs(self) -> list:
        names = set(self.dispatcher.available_names())
        return [spec for spec in self.deps.registry.specs() if spec.name in names]

    def _initial_messages(self, conversation: List[Message]) -> List[Message]:
        if not self.use_inline:
            return list(conversation)
        hint = Message(role="system", content=tool_instructions(self._tool_specs()))
        leading = 0
        while leading < len(conversation) and conversation[leading].role == "system":
            leading += 1
        return conversation[:leading] + [hint] + conversation[leading:]

    # --- events ---------------------------------------------------------------------
    def report_parse_problems(self, fed: Any) -> None:
        """Bad blocks the model closed become error results it reads; others are told as events."""
        told = set()
        for call, reason in fed.rejected:
            told.add(reason)
            what = f"tool '{call.name}'" if call.name else "a tool block"
            self.dispatcher.reject(call, f"{what} was not run: {reason}; write the block again as "
                                         f'<tool name="NAME">{{"argument": "value"}}</tool> with a JSON object')
        for reason in fed.errors:
            if reason not in told:
                self.deps.log.warning("tool block shown as text, not run: {}", reason)
                self.state.emit(ErrorEvent(f"a tool block could not be read: {reason}", fatal=False))

    def _on_tool_start(self, call: ToolCall) -> None:
        """Runs on the tool's worker as the function is entered.

        A call given up on while it was being entered (its ``tool_result``, a
        cancel, is out already; the run may be over) is not news any more.
        """
        if call.id not in self._reported:
            self.state.emit(ToolStartEvent(call))

    def _on_tool_result(self, result: ToolResult, skipped: Optional[str]) -> bool:
        """Runs the moment a result is fixed (on the tool's worker, or at once for a skipped call).

        False when the call's result was told already (this one is dropped).  A call a
        gate stopped is no tool outcome (it is counted by its gate); a skip is logged.
        """
        if not self._report_once(result, skipped):
            return False
        if skipped not in GATE_SKIPS:
            self._count_tool_outcome(result)
        if skipped is not None:
            self.deps.log.info("tool {!r} (call {}) not run ({}): {}", result.name, result.call_id, skipped,
                               result.error)
        filing = self.deps.filing
        ticket = filing.file(result, self.state.scope, self._filing_failed) if filing is not None else None
        if ticket is not None:
            with self._lock:
                self._tickets[result.call_id] = ticket
        return True

    def _report_once(self, result: ToolResult, skipped: Optional[str]) -> bool:
        """Send ``tool_result`` for a call once: a tool given up on may still return later."""
        with self._lock:
            if result.call_id in self._reported:
                return False
            self._reported.add(result.call_id)
        self.state.emit(ToolResultEvent(result, skipped))
        return True

    def _filing_failed(self, problem: str) -> None:
        with self._lock:
            self.state.telemetry.filing_errors += 1
        self.state.emit(ErrorEvent(problem, fatal=False))

    def release(self) -> None:
        """The run is over: let go of the dispatcher, whose callbacks point back here.

        Without this the runner and its dispatcher hold each other, and a finished
        run's objects (its state, loop, events, telemetry) wait for a garbage
        collection instead of dying with their last reference.  A tool given up on
        that returns later still reaches ``_on_tool_result``, which tells nothing:
        its result was fixed already.
        """
        del self.dispatcher

    # --- the loop -----------------------------------------------------------------------
    def run(self) -> Steps:
        """The rounds, then ``done``; a bug in them (not a provider's fault) still ends the run with ``done``.

        The catch is here, not in a generator around this one: every wait of
        the run passes through one generator level less.
        """
        try:
            last_round = self.config.max_continuations + 1
            for round_no in range(1, last_round + 1):
                if self.state.cancel.is_set():
                    self._stop("cancelled")
                    break
                if not (yield from self._round(round_no, is_last=round_no == last_round)):
                    break
            self._finish()
        except GeneratorExit:
            raise
        except BaseException as exc:  # never leave the caller without a DoneEvent
            self.deps.log.opt(exception=True).error("run failed unexpectedly: {}", exc)
            self.fail_unexpectedly(exc)

    def _round(self, round_no: int, *, is_last: bool) -> Steps:
        """Run one round; True when another round should follow."""
        self._round_no = round_no
        self.state.telemetry.rounds = round_no
        self.state.emit(RoundEvent(round_no))
        self.dispatcher.begin_round()
        stream = RoundStream(self, round_no)  # reset in place on a failover: its callbacks stay bound
        tried: List[str] = []

        def may_advance() -> bool:
            if stream.committed:
                if not self.config.failover_after_tokens:
                    return False
                failed = tried[-1] if tried else "the model"
                self.state.emit(ResetEvent(round_no, f"model {failed} failed mid-answer; "
                                                     f"the round is streamed again on another model"))
            self.dispatcher.reset_round()
            stream.reset()
            return True

        traced = RoundTrace(self.state.trace, self.messages, self.config.options) if self.state.trace else None

        def on_attempt(model: str, _number: int) -> None:
            tried.append(model)
            if traced is not None:
                traced.started(model)

        def on_attempt_failed(model: str, exc: BaseException) -> None:
            self.state.telemetry.failed_attempts.append(attempt_failure(model, exc))
            if traced is not None:
                traced.failed(model, exc)

        on_chunk = stream.on_chunk
        try:
            outcome = yield from self.deps.failover.stream_call(
                self.messages, tools=self._tool_specs() if self.use_native else None,
                options=self.config.options, cancel=self.state.cancel,
                on_chunk=traced.watching(on_chunk) if traced else on_chunk, may_advance=may_advance,
                on_attempt=on_attempt,
                on_attempt_failed=on_attempt_failed,
                on_tool_calls=stream.on_tool_calls if self.use_native else None)
        except LlmError as exc:
            if tried:
                self.state.telemetry.model_used = tried[-1]
                self.state.telemetry.failovers += len(dict.fromkeys(tried)) - 1
            self._on_llm_error(stream, exc)
            return False
        if traced:
            traced.succeeded(outcome.response)
        stream.finish(outcome.response)
        self._count_parse_errors(stream)
        self._account(outcome)
        if (outcome.response.finish_reason or "stop") not in CUT_OFF_FINISH_REASONS:
            if self.dispatcher.holds_calls:
                # Hand the round's events over before ``approve`` is asked: a person sees the text
                # a question is about before the question (the loop empties its outbox at each wait).
                yield Wait(ready=lambda: True)
            self.dispatcher.release_side_effects()
        else:
            self.dispatcher.drop_held()
        self.dispatcher.cancel_unused_replays()
        if self.dispatcher.untold_stopped:
            self.state.emit(ErrorEvent(self.dispatcher.untold_summary(), fatal=False))
        text = stream.text
        self.state.rounds.append(text)
        results = yield from self._join_round()
        if self.state.cancel.is_set():
            self._stop("cancelled")
            return False
        if not self.dispatcher.found_calls:
            self.state.answer = text
            return False
        if is_last:
            self._stop("max_continuations_reached")
            self.state.answer = _joined(self.state.rounds)
            return False
        self._continue_with(stream, results)
        return True

    def _account(self, outcome: Any) -> None:
        telemetry = self.state.telemetry
        telemetry.model_used = outcome.model
        telemetry.failovers += outcome.failovers
        telemetry.finish_reasons.append(outcome.response.finish_reason)
        usage = outcome.response.usage
        if usage is not None:
            self.state.usage = usage if self.state.usage is None else self.state.usage + usage
        refusal = outcome.response.refusal
        if refusal:
            self.state.refusal = _joined([self.state.refusal or "", refusal])
            self.state.emit(RefusalEvent(refusal, self._round_no))

    def _join_round(self) -> Steps:
        """The round's results in call order (each was already sent as it finished).

        With a store, the round's filings must be searchable when the next round
        starts: each is waited for (one slower than ``filing_timeout`` is one
        filing error, never waited for again), found by the id its result was
        told under (a call reused from a failed attempt keeps its first id).
        """
        results, told_as = [], []
        for entry in self.dispatcher.entries():
            results.append((yield from self._await(entry)))
            handle = entry_handle(entry)
            told_as.append(handle.call.id if handle is not None else results[-1].call_id)
        self.state.results.extend(results)
        if self.deps.filing is not None:
            with self._lock:  # each result was told (``_await``): its filing, if any, is queued
                tickets = [self._tickets.pop(i) for i in told_as if i in self._tickets]
            yield from wait_filed(tickets, self.config.filing_timeout, self.state.cancel)
        return results

    def _await(self, entry: Any) -> Steps:
        """The entry's result once told (sent, counted, queued for filing); at once if the run is cancelled.

        Its report (``dispatcher.report_of``) says so, not the handle: a handle is done before the thread
        that fixed its result has told it.  ``handle.done()`` fixes a result whose deadline passed.
        """
        handle = entry_handle(entry)
        if handle is None:
            return entry_result(entry)
        cancel = self.state.cancel
        report = self.dispatcher.report_of(handle)
        wait = Wait(None, ready=report.is_set)  # woken by the report, or the cancel
        report.wake = wait.wake
        while not report.is_set():
            if cancel.is_set():
                handle.cancel()
                return self._given_up(entry, "cancelled: the run was cancelled before the tool finished")
            wait.until = _NEVER if handle.done() else handle.next_limit
            yield wait
        return entry_result(entry)

    def _given_up(self, entry: Any, reason: str) -> ToolResult:
        """A call the run stops waiting for: its result if fixed, else an abandoned one (``reason``), told now.

        A result fixed just now is told by the thread that fixed it: waited for (briefly), not sent after ``done``.
        """
        handle = entry_handle(entry)
        if handle is None:
            return entry_result(entry)
        if not handle.done():
            result = ToolResult.error_result(handle.call, reason)
            if self._on_tool_result(result, "cancelled"):
                return result  # else the worker fixed the real one meanwhile, and is telling it
        self.dispatcher.report_of(handle).wait(REPORT_GRACE_S)
        return entry_result(entry)

    def _count_tool_outcome(self, result: ToolResult) -> None:
        telemetry = self.state.telemetry
        with self._lock:
            telemetry.max_queue_wait_s = max(telemetry.max_queue_wait_s, result.queue_wait_s)
            if result.ok:
                telemetry.tools_ok += 1
            elif result.timed_out:
                telemetry.tools_timed_out += 1
            else:
                telemetry.tools_failed += 1

    def _continue_with(self, stream: RoundStream, results: List[ToolResult]) -> None:
        self.messages.extend(continuation_messages(stream.text, stream.native_calls, results,
                                                   self.dispatcher.untold_stopped, stream.wire_ids))

    # --- endings ----------------------------------------------------------------------------
    def _count_parse_errors(self, stream: RoundStream) -> None:
        if stream.parser is not None:
            self._parser_errors += stream.parser.parse_errors

    def _on_llm_error(self, stream: RoundStream, exc: LlmError) -> None:
        if stream.parser is not None and stream.text_parts:
            # Text held back as a possible block start belongs to the partial answer.
            held = stream.parser.flush().visible
            if held:
                stream.show(held)
        self._count_parse_errors(stream)
        self.dispatcher.drop_held()
        self.dispatcher.cancel_all()
        self.dispatcher.cancel_unused_replays()
        self._collect_abandoned()
        if isinstance(exc, LlmCancelledError) or self.state.cancel.is_set():
            self.state.rounds.append(stream.text)
            self._stop("cancelled")
            return
        self.state.error = str(exc)
        if isinstance(exc, LlmOutputLimitError):
            self._stop("output_limit")
        if not stream.committed:
            warning = f"{LLM_WARNING}{exc}"
            stream.show(warning)
            self.state.emit(ErrorEvent(str(exc)))
            self._stop("llm_error")
        else:
            self.state.emit(ErrorEvent(f"the model's stream failed after a partial answer: {exc}"))
            self._stop("llm_error_after_tokens")
        self.state.rounds.append(stream.text)
        # Everything the person has read stays in the answer: earlier drafts too.
        self.state.answer = _joined(self.state.rounds)

    def _collect_abandoned(self) -> None:
        """The tools of a broken round, without waiting for the ones still running."""
        for entry in self.dispatcher.entries():
            self.state.results.append(self._given_up(entry, "cancelled: the round ended before the tool finished"))

    def _stop(self, reason: str) -> None:
        if self.state.telemetry.stop_reason is None:
            self.state.telemetry.stop_reason = reason

    def _finish(self) -> None:
        state = self.state
        telemetry = state.telemetry  # the dispatcher counted into it; the scanner's errors are added here
        telemetry.parse_errors += self._parser_errors
        self._parser_errors = 0
        telemetry.total_s = time.monotonic() - state.started
        answer = state.answer if state.answer is not None else _joined(state.rounds)
        result = EngineResult(answer=answer, rounds=tuple(state.rounds), tool_results=tuple(state.results),
                              telemetry=telemetry, usage=state.usage, error=state.error,
                              refusal=state.refusal)
        state.done = True
        state.emit(DoneEvent(result))

    def fail_unexpectedly(self, exc: BaseException) -> None:
        """A bug, not a provider fault: still end with ``error`` and ``done``."""
        if self.state.done:
            return
        self.dispatcher.cancel_all()
        self.state.error = f"internal error: {type(exc).__name__}: {exc}"
        self.state.emit(ErrorEvent(self.state.error))
        self._stop("internal_error")
        self._finish()
