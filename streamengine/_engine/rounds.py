"""One run of the engine, round by round, as a generator driven by the thread that iterates the run.

Each round streams the model's answer; visible text goes to the caller as it
arrives while completed tool calls go through the run's :class:`ToolCalls` at
once, and each ``tool_result`` is sent the moment its tool finishes.  After
the stream the round collects its results in call order, and if it found any
call the next round asks the model for a revised answer.

:meth:`RoundRunner.run` does not block on the provider or on a tool: where it
would, it yields a :class:`~streamengine._wait.Wait`, and the run's
loop (``loop.RunLoop``) waits for it together with everything else: a
tool's result being told, a round's filing (bounded by ``filing_timeout``), the model.

Also here: what a run needs (:class:`RunDeps`) and gathers (:class:`RunState`),
as plain data, so a run is built and tested without a ``StreamingEngine``;
what one round keeps while its stream flows (:class:`RoundStream`); and the
round's OpenTelemetry chat spans (:class:`RoundTrace`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generator, Iterable, List, Optional, Sequence, Set

from .._accumulate import BLOCK, TextBuffer
from .._calls.failover import ModelFailover
from .._cancel import CancelToken
from .._config import EngineConfig, output_chars, output_limit_error
from .._errors import LlmCancelledError, LlmError, LlmOutputLimitError
from .._inline import InlineToolScanner, tool_instructions
from .._messages import LLM_WARNING, Chunk, Message, Response, ToolCall, ToolResult, ToolSpec, Usage
from .._wait import Wait, at_once
from ..tools import ToolExecutor, ToolRegistry
from .checkpoint import Checkpoint, restore_state, snapshot
from .events import DoneEvent, ErrorEvent, Event, ReasoningEvent, RefusalEvent, ResetEvent, RoundEvent, TokenEvent
from .result import CUT_OFF_FINISH_REASONS, EngineResult, Telemetry, attempt_failure
from .tool_calls import ToolCalls, continuation_messages

Steps = Generator[Wait, None, Any]


def _joined(parts: Iterable[str]) -> str:
    return "\n\n".join(part for part in parts if part)


class RoundRunner:
    """Runs the rounds of one request; ``run()`` (a generator of waits) ends with a ``DoneEvent``."""

    def __init__(self, deps: RunDeps, state: RunState, resume: Optional[Checkpoint] = None,
                 on_checkpoint: Optional[Callable[[Checkpoint], None]] = None) -> None:
        self.deps = deps
        self.config = deps.config
        self.state = state
        has_tools = bool(deps.registry.names)
        self.use_inline = has_tools and self.config.uses_inline_tools
        self.use_native = has_tools and self.config.uses_native_tools
        self._round_no = 0
        self._parser_errors = 0
        self.output_left = self.config.max_run_output_chars  # spent chunk by chunk by each RoundStream
        self.resume = resume
        self.on_checkpoint = on_checkpoint
        self._quiet_round = 0  # a resumed run's first round: announced by its reset, not a second ``round``
        if resume is not None:
            restore_state(self, resume)  # before ToolCalls: it counts into the restored telemetry
        self.calls = ToolCalls(deps, state)
        if resume is not None and resume.round > 0:
            self.messages = list(resume.messages)  # the continuation of round ``resume.round`` included
        else:
            self.messages = self._initial_messages(state.conversation)
        if resume is not None:
            self.calls.restore(resume.call_ids, resume.started, resume.tools_total, resume.interrupted)

    # --- set-up -------------------------------------------------------------------
    def _tool_specs(self) -> List[ToolSpec]:
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
        """The rounds, then ``done``; a bug in them (not a provider's fault) still ends the run with ``done``."""
        try:
            last_round = self.config.max_continuations + 1
            first = self._begin()
            for round_no in range(first, last_round + 1):
                if self.state.cancel.is_set():
                    self._stop("cancelled")
                    break
                if not (yield from self._round(round_no, is_last=round_no == last_round)):
                    break
                if self.on_checkpoint is not None:
                    yield Wait(ready=at_once)  # the round's events go to the consumer before its checkpoint
                    self._checkpoint(round_no)
            self._finish()
        except GeneratorExit:
            raise
        except BaseException as exc:  # never leave the caller without a DoneEvent
            self.deps.log.opt(exception=True).error("run failed unexpectedly: {}", exc)
            self.fail_unexpectedly(exc)
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the caller's to handle
                raise

    def _begin(self) -> int:
        """The first round to run: 1, or the one after a resumed checkpoint's (announced with ``reset``)."""
        if self.resume is None:
            if self.on_checkpoint is not None:
                self._checkpoint(0)
            return 1
        interrupted = self._quiet_round = self.resume.round + 1
        self.state.emit(ResetEvent(interrupted, f"the run was taken over after round {self.resume.round}; round "
                                                f"{interrupted} is asked again"))
        return interrupted

    def _checkpoint(self, completed: int) -> None:
        """Hand the run's checkpoint after ``completed`` rounds to ``on_checkpoint``; a hook that fails is logged."""
        assert self.on_checkpoint is not None
        try:
            self.on_checkpoint(snapshot(self, completed, time.monotonic() - self.state.started))
        except Exception as exc:  # the run goes on; only a takeover from this round is lost
            self.deps.log.opt(exception=exc).warning("on_checkpoint failed after round {}: {}", completed, exc)

    def _round(self, round_no: int, *, is_last: bool) -> Steps:
        """Run one round; True when another round should follow."""
        self._round_no = round_no
        self.state.telemetry.rounds = round_no
        if round_no != self._quiet_round:
            self.state.emit(RoundEvent(round_no))
        self.calls.begin_round()
        stream = RoundStream(self, round_no)  # reset in place on a failover: its callbacks stay bound
        tried: List[str] = []

        def may_advance() -> bool:
            failed = tried[-1] if tried else "the model"
            if stream.committed:
                if not self.config.failover_after_tokens:
                    return False
                self.state.emit(ResetEvent(round_no, f"model {failed} failed mid-answer; "
                                                     f"the round is streamed again on another model"))
            elif stream.reasoning_parts:  # only thoughts were shown: they go, the round is asked again
                self.state.emit(ResetEvent(round_no, f"model {failed} failed while thinking; "
                                                     f"the round is asked again"))
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
                options=self.config.options, cancel=self.state.cancel,  # type: ignore[arg-type]
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
        self._keep_round(stream, text)
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
        self._continue_with(stream, results, outcome.response)
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

    def _continue_with(self, stream: RoundStream, results: List[ToolResult], response: Response) -> None:
        self.messages.extend(continuation_messages(stream.text, stream.native_calls, results,
                                                   self.calls.untold_stopped, stream.wire_ids,
                                                   response.provider_items))

    def _keep_round(self, stream: RoundStream, text: Optional[str] = None) -> None:
        """The round's text (``text`` when the caller joined it already) and its reasoning: kept for the result."""
        self.state.rounds.append(stream.text if text is None else text)
        self.state.reasoning_rounds.append(stream.reasoning)

    # --- endings ----------------------------------------------------------------------------
    @property
    def parse_errors_pending(self) -> int:
        """The inline scanner's errors not in the telemetry yet (they go in when the run ends; a checkpoint adds
        them)."""
        return self._parser_errors

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
            self._keep_round(stream)
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
        self._keep_round(stream)
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
                              refusal=state.refusal, reasoning_rounds=tuple(state.reasoning_rounds))
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


# --- What a run needs from its engine (:class:`RunDeps`) and what it gathers (:class:`RunState`). ------------------
# Plain data, so that :class:`RoundRunner` never takes the engine: a run can be
# built and tested without a :class:`~streamengine._engine.run.StreamingEngine`.

@dataclass(frozen=True)
class RunDeps:
    """What a run needs from the engine that started it, and nothing more.

    Shared by every run of one engine; each field is safe to use from many
    runs at once.  ``filing`` (a :class:`~.filing.FilingQueue`; None without a
    store: no filing, no filing wait) files successful results off the tool
    workers; ``run_tools(scope)`` gives the tools bound to one run's RAG scope
    (``rag_search``).  ``approve`` is asked before a side-effect tool runs.
    """

    config: EngineConfig
    registry: ToolRegistry
    executor: ToolExecutor
    failover: ModelFailover
    log: Any
    filing: Any = None
    run_tools: Optional[Callable[[str], Dict[str, Any]]] = None
    approve: Optional[Callable[[ToolCall], object]] = None


@dataclass
class RunState:
    """What one run has gathered so far; owned by the thread that drives the run.

    ``emit`` puts an event, from any thread; ``emit_here`` (when given) only
    from the thread that drives the run, which needs no wake-up: a token then
    costs a deque append (bench section 14 counts the call it saves).
    """

    conversation: List[Message]
    cancel: CancelToken
    emit: Callable[[Event], None]
    started: float
    scope: str = ""  # the RAG scope this run files into and searches: its conversation, or itself
    telemetry: Telemetry = field(default_factory=Telemetry)
    rounds: List[str] = field(default_factory=list)
    reasoning_rounds: List[str] = field(default_factory=list)  # beside ``rounds``: each round's reasoning
    results: List[ToolResult] = field(default_factory=list)
    usage: Optional[Usage] = None  # None until the provider reports usage
    answer: Optional[str] = None
    error: Optional[str] = None
    refusal: Optional[str] = None
    done: bool = False
    emit_here: Optional[Callable[[Event], None]] = None  # None: ``emit`` serves the driving thread too
    trace: Any = None  # the run's OpenTelemetry trace (``_otel.tracing.RunTrace``), None when not traced

# --- What one round keeps while its stream flows: the inline scanner, the text shown, the native calls. ------------
# Native tool calls are assembled once, by the call strategy's accumulator
# (which also builds the response): the round dispatches the calls it reports
# complete during the stream and, at the end, the response's others.  Reset
# in place when failover streams the round again.
#
# The run's total output cap (``EngineConfig.max_run_output_chars``) is spent
# here, chunk by chunk, from the runner's ``output_left``: the per-call caps
# live in the call strategy's aggregator, but only the run sees every round.

class RoundStream:
    """Everything one round keeps while its stream flows (see the section comment above).

    One per round, :meth:`reset` in place when failover streams the round
    again: the call strategy holds its bound :meth:`on_chunk` from the start.
    """

    def __init__(self, runner: RoundRunner, round_no: int) -> None:
        self.runner = runner
        self.round_no = round_no
        state = runner.state
        self._emit = state.emit_here if state.emit_here is not None else state.emit
        self._telemetry = state.telemetry
        self._started = state.started
        self.reset()

    def reset(self) -> None:
        """Start the round's stream afresh: a new scanner, nothing shown, no native call taken."""
        runner = self.runner
        # Ids must stay unique across the rounds of a request: the round is in the prefix.
        self.parser = InlineToolScanner(max_block_chars=runner.config.max_block_chars,
                                        id_prefix=f"call_inline_r{self.round_no}_") if runner.use_inline else None
        # What the person saw (tool blocks left out), joined every BLOCK pieces: memory follows the text.
        self.text_parts = TextBuffer()
        self._parts = self.text_parts.parts  # show() appends here directly
        self.reasoning_parts = TextBuffer()  # what the model thought, apart from the text
        self._untimed = self._telemetry.time_to_first_token_s is None
        self.native_calls: List[ToolCall] = []  # as dispatched: under the id the run gave each
        #: A native call's run id -> the id its provider gave it, where the run renamed it (the id was taken
        #: by an inline call, or by a failed attempt) but the provider's is still free in this answer.
        self.wire_ids: Dict[str, str] = {}
        self._wire_taken: Set[str] = set()  # the ids this answer's native calls are answered under
        self._taken: Set[int] = set()  # the accumulator's calls handed to the dispatcher (by identity)

    def on_chunk(self, chunk: Chunk) -> None:
        """Called in the driving thread for every chunk: show text, dispatch inline calls at once."""
        content = chunk.content
        runner = self.runner
        if chunk.text_only:  # answer text alone: nearly every chunk, one test
            runner.output_left -= len(content)  # type: ignore[arg-type]  # text_only: content is a str
        else:
            runner.output_left -= output_chars(chunk)
            if chunk.reasoning and runner.output_left >= 0:
                self.think(chunk.reasoning)
        if runner.output_left < 0:
            cap = runner.config.max_run_output_chars
            raise output_limit_error("run output", cap, "EngineConfig.max_run_output_chars")
        if content:
            parser = self.parser
            if parser is None or (parser.plain and "<" not in content):  # prose: almost every token
                self.show(content)
            else:
                self._take(parser.feed(content))

    def show(self, text: str) -> None:
        """Text the person sees: kept for the answer, timed if it is the run's first, sent as a token."""
        parts = self._parts
        parts.append(text)
        if len(parts) >= BLOCK:
            self.text_parts.compact()
        if self._untimed:
            self._untimed = False
            if self._telemetry.time_to_first_token_s is None:
                self._telemetry.time_to_first_token_s = time.monotonic() - self._started
        self._emit(TokenEvent(text))

    def think(self, text: str) -> None:
        """Reasoning as it streams: kept apart from the text, sent as a ``reasoning`` event."""
        self.reasoning_parts.append(text)
        self._emit(ReasoningEvent(text, self.round_no))

    def _take(self, fed: Any) -> None:
        """What the scanner made of some text: show the visible part, report bad blocks, dispatch calls."""
        if fed.visible:
            self.show(fed.visible)
        if fed.errors:
            self.runner.report_parse_problems(fed)
        for call in fed.calls:
            self.runner.calls.dispatch(call)

    def on_tool_calls(self, calls: List[ToolCall]) -> None:
        """Native calls the strategy's accumulator found complete: dispatched at once.

        Each is dispatched under the id the run gives it (:meth:`ToolCalls.own_id`)
        and answered under the provider's own, unless this answer has two calls with
        that id: the second is answered under its run id (``dup_2``).  A call only
        summed up (None) is not answered one by one.
        """
        for call in calls:
            self._taken.add(id(call))
            dispatched = self.runner.calls.dispatch(call)
            if dispatched is None:
                continue
            self.native_calls.append(dispatched)
            if dispatched.id != call.id and call.id not in self._wire_taken:
                self.wire_ids[dispatched.id] = call.id
            self._wire_taken.add(self.wire_ids.get(dispatched.id, dispatched.id))

    def finish(self, response: Response) -> None:
        """The stream completed: release held-back text, dispatch the native calls not dispatched yet."""
        if self.parser is not None:
            self._take(self.parser.flush())
        if self.runner.use_native:
            self.on_tool_calls([call for call in response.tool_calls if id(call) not in self._taken])

    @property
    def committed(self) -> bool:
        """Something reached the caller or a tool started: no failover from here on."""
        return bool(self.text_parts) or self.runner.calls.started_any

    @property
    def text(self) -> str:
        return self.text_parts.text()

    @property
    def reasoning(self) -> str:
        return self.reasoning_parts.text()

# --- The run's side of OpenTelemetry: chat spans per model attempt (tool spans: ``tool_calls``). -------------------
# Only used when the engine has an instrumentation (``opentelemetry-api``
# installed); the round then gets these wrappers instead of its plain
# callbacks, so an engine without it pays nothing per chunk.  Each
# hook runs under the instrumentation's guard (``_otel.guard.Guard``): a span
# processor or exemplar filter that raises costs the run its telemetry, never
# an event (a ``tool_start``, a ``tool_result``, the round itself).

class RoundTrace:
    """One round's model attempts as ``chat`` spans: started, first chunk, failed or succeeded."""

    def __init__(self, run_trace: Any, messages: Sequence[Any], options: Any) -> None:
        self.run_trace = run_trace
        self.guard = run_trace.owner.guard
        self.messages = messages
        self.options = options
        self.chat: Any = None
        self.seen_output = False

    def started(self, model: str) -> None:
        self.chat = None
        self.seen_output = False
        with self.guard("starting a chat span"):
            self.chat = self.run_trace.chat_started(model=model, options=self.options, messages=self.messages)

    def failed(self, _model: str, exc: BaseException) -> None:
        chat, self.chat = self.chat, None
        if chat is None:
            return
        with self.guard("ending a chat span"):
            if isinstance(exc, LlmCancelledError):
                chat.abandoned("cancelled")
            else:
                chat.failed(exc)

    def succeeded(self, response: Response) -> None:
        chat, self.chat = self.chat, None
        if chat is not None:
            with self.guard("ending a chat span"):
                chat.succeeded(response)

    def watching(self, on_chunk: Callable[[Chunk], None]) -> Callable[[Chunk], None]:
        """``on_chunk`` that also marks the attempt's first *meaningful* chunk (the engine's own rule).

        Unwrapped when nothing would record it (no SDK): a chunk then costs what it costs untraced.
        """
        if not self.run_trace.watches_chunks:
            return on_chunk

        def hooked(chunk: Chunk) -> None:
            if not self.seen_output and chunk.is_meaningful and self.chat is not None:
                self.seen_output = True
                with self.guard("marking the first chunk"):
                    self.chat.first_chunk()
            on_chunk(chunk)
        return hooked
