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

import time
from typing import Any, Generator, Iterable, List

from .._errors import LlmCancelledError, LlmError, LlmOutputLimitError
from .._inline.prompt import tool_instructions
from .._messages import LLM_WARNING, Message, ToolResult
from .._wait import Wait
from .continuation import continuation_messages
from .events import DoneEvent, ErrorEvent, RefusalEvent, ResetEvent, RoundEvent
from .result import CUT_OFF_FINISH_REASONS, EngineResult, attempt_failure
from .round_stream import RoundStream
from .run_state import RunDeps, RunState
from .tool_calls import ToolCalls
from .traced import RoundTrace

Steps = Generator[Wait, None, Any]


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
        self._round_no = 0
        self.calls = ToolCalls(deps, state)
        self.messages = self._initial_messages(state.conversation)
        self._parser_errors = 0
        self.output_left = self.config.max_run_output_chars  # spent chunk by chunk by each RoundStream

    # --- set-up -------------------------------------------------------------------
    def _tool_specs(self) -> list:
        names = set(self.calls.available_names())
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
            self.calls.reject(call, f"{what} was not run: {reason}; write the block again as "
                                         f'<tool name="NAME">{{"argument": "value"}}</tool> with a JSON object')
        for reason in fed.errors:
            if reason not in told:
                self.deps.log.warning("tool block shown as text, not run: {}", reason)
                self.state.emit(ErrorEvent(f"a tool block could not be read: {reason}", fatal=False))

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
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the caller's to handle
                raise

    def _round(self, round_no: int, *, is_last: bool) -> Steps:
        """Run one round; True when another round should follow."""
        self._round_no = round_no
        self.state.telemetry.rounds = round_no
        self.state.emit(RoundEvent(round_no))
        self.calls.begin_round()
        stream = RoundStream(self, round_no)  # reset in place on a failover: its callbacks stay bound
        tried: List[str] = []

        def may_advance() -> bool:
            if stream.committed:
                if not self.config.failover_after_tokens:
                    return False
                failed = tried[-1] if tried else "the model"
                self.state.emit(ResetEvent(round_no, f"model {failed} failed mid-answer; "
                                                     f"the round is streamed again on another model"))
            self.calls.reset_round()
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
            yield from self.calls.approve_held()
        else:
            self.calls.drop_held()
        self.calls.cancel_unused_replays()
        if self.calls.untold_stopped:
            self.state.emit(ErrorEvent(self.calls.untold_summary(), fatal=False))
        text = stream.text
        self.state.rounds.append(text)
        results = yield from self.calls.results()
        if self.state.cancel.is_set():
            self._stop("cancelled")
            return False
        if not self.calls.found_calls:
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

    def _continue_with(self, stream: RoundStream, results: List[ToolResult]) -> None:
        self.messages.extend(continuation_messages(stream.text, stream.native_calls, results,
                                                   self.calls.untold_stopped, stream.wire_ids))

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
        self.calls.abandon_round()
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
        self.calls.cancel_all()
        self.state.error = f"internal error: {type(exc).__name__}: {exc}"
        self.state.emit(ErrorEvent(self.state.error))
        self._stop("internal_error")
        self._finish()
