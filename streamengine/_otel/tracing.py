"""Spans and metrics of one run: ``invoke_agent`` over ``chat`` per model call and ``execute_tool`` per tool.

The engine calls these hooks where things happen (the run's start and end,
each model call, each tool's entry and result), from whichever thread they
happen on: the run's consumer, a tool worker, a remote result's thread.  Every
span is started with an explicit parent (the run span, itself a child of the
context current when ``run()`` was called), so nothing depends on which
thread is current, and a tool span overlaps the chat span that asked for it
exactly as the tool overlapped the model's stream.

A span that was never recording (no SDK configured) gets no attributes: the
work of building them is skipped, which is what keeps the API-only cost near
zero.  What the SDK runs inside these calls (span processors, exemplar
filters) cannot raise into the run (``guard.Guard``), and a span's status
shows an error's text only with content capture on (``Instrumentation.error_status``).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, SpanKind, Status, StatusCode

from . import conventions as c
from .chat import ChatTrace, mark_unfinished, unfinished_text
from .guard import Guard
from .metrics import Instruments

SCOPE = "streamengine"

#: The tool span of a call being handed over on this thread (a tool that starts itself, e.g. MCP):
#: set by the start hook, taken by the tool as it starts, so its own client span nests under it.
_handing_over = threading.local()


def take_hand_over() -> Optional[tuple]:
    """``(context, instrumentation)`` of the tool span being handed over on this thread, once; else None."""
    pending = getattr(_handing_over, "pending", None)
    _handing_over.pending = None
    return pending


def mcp_client_span(pending: tuple, tool_name: str, transport: str) -> Any:
    """The MCP client span (``tools/call {tool}``) under the call's tool span, and its ``_meta`` carrier."""
    from opentelemetry import propagate
    parent, owner = pending
    span: Any = None
    carrier: Dict[str, str] = {}
    with owner.guard("starting an MCP client span"):
        span = owner.tracer.start_span(f"tools/call {tool_name}", context=parent, kind=SpanKind.CLIENT)
        if span.is_recording():
            span.set_attributes({"mcp.method.name": "tools/call", c.TOOL_NAME: tool_name,
                                 c.OPERATION: "execute_tool", "network.transport": transport})
        propagate.inject(carrier, context=trace.set_span_in_context(span, parent))
    return (span, owner), carrier


def end_mcp_client_span(handle: tuple, error: Optional[BaseException]) -> None:
    """End the span :func:`mcp_client_span` made (none when its start failed), with the call's error."""
    span, owner = handle
    if span is None:
        return
    with owner.guard("ending an MCP client span"):
        if error is not None:
            kind = type(error).__name__
            span.set_attribute(c.ERROR_TYPE, kind)
            span.set_status(owner.error_status(kind, str(error)))
        span.end()


def _api_own(provider: Any, api_module: str) -> bool:
    """Whether ``provider`` is one of the API's own, which record nothing: its no-op one, or the proxy a
    ``get_*_provider()`` returns until an SDK's is set (``ProxyTracerProvider``, ``_ProxyMeterProvider``:
    names that have changed before), told by the module they are defined in."""
    return type(provider).__module__.startswith(api_module)


def _wall_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` reading as epoch nanoseconds (what span timestamps are)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class Instrumentation:
    """One per engine: the tracer, the instruments, and what to capture."""

    def __init__(self, *, agent_name: str, capture: c.Capture, tracer_provider: Any = None,
                 meter_provider: Any = None, version: str = "", client: Any = None) -> None:
        self.agent_name = agent_name
        self.capture = capture
        self.client = client
        self.tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        self.guard = Guard()
        self.instruments = Instruments(meter_provider, version, self.guard)
        self._meter_given = meter_provider is not None
        self._tracer_given = tracer_provider is not None

    def live(self, parent: Any) -> bool:
        """Whether a run's trace would reach anything; a run without one builds no spans (220k instructions).

        Yes for a tracer provider given or an SDK's set globally (by now: the
        API's proxy forwards to one set later), live metrics, or a caller's
        span in ``parent`` whose context the run's spans would pass on; no for
        the API alone, whose spans record nothing.
        """
        if self._tracer_given or not _api_own(trace.get_tracer_provider(), "opentelemetry.trace"):
            return True
        return self.metrics_live() or trace.get_current_span(parent).get_span_context().is_valid

    def metrics_live(self) -> bool:
        """Whether recorded measurements go anywhere: a meter provider given, or an SDK's set globally."""
        if self._meter_given:
            return True
        from opentelemetry import metrics
        return not _api_own(metrics.get_meter_provider(), "opentelemetry.metrics")

    def error_status(self, kind: str, detail: Optional[str]) -> Status:
        """An ERROR status: its description is ``detail`` (a tool's exception text, a provider's error body)
        only with content capture on the span, else the error type alone."""
        return Status(StatusCode.ERROR, detail if detail and self.capture.on_span else kind)

    def end_span(self, span: Any, where: str, end_time: Optional[int] = None) -> None:
        """``span.end()``, where the SDK runs the span processors' ``on_end``: guarded."""
        with self.guard(where):
            span.end(end_time=end_time)

    @staticmethod
    def current_context() -> Any:
        """The context current in the calling thread: a run's span is parented to it."""
        return otel_context.get_current()

    def start_run(self, *, parent: Any, conversation_id: Optional[str], messages: Sequence[Any]) -> RunTrace:
        return RunTrace(self, parent, conversation_id, messages)

    def describe(self, model: str) -> Dict[str, Any]:
        """Provider name, base URL and streaming of the client that serves ``model`` (a routed one's route)."""
        client, name = self.client, model
        route = getattr(client, "route", None)
        if callable(route):
            try:
                client, name = route(model)
            except Exception:  # a bad route fails the call itself, with its own message
                pass
        return {"provider": c.provider_of(client), "base_url": getattr(client, "base_url", None),
                "stream": callable(getattr(client, "stream", None)), "model": name or model}


class RunTrace:
    """The ``invoke_agent`` span of one run and everything under it."""

    def __init__(self, owner: Instrumentation, parent: Any, conversation_id: Optional[str],
                 messages: Sequence[Any]) -> None:
        self.owner = owner
        self.started = time.monotonic()
        span: Any = INVALID_SPAN  # a span that failed to start: its children go under the caller's
        with owner.guard("starting the run's span"):
            span = owner.tracer.start_span(f"invoke_agent {owner.agent_name}", context=parent, kind=SpanKind.INTERNAL)
        self.span = span
        self.context = parent if span is INVALID_SPAN else trace.set_span_in_context(span, parent)
        self.recording = span.is_recording()
        #: Whether per-chunk work (the first meaningful chunk) is worth doing: nothing records it otherwise.
        self.watches_chunks = self.recording or owner.metrics_live()
        self._tools: Dict[str, Any] = {}
        self._chats: list = []
        self._lock = threading.Lock()  # tool spans are opened and closed from tool workers
        self._ended = False
        self._stream_open: Optional[float] = None  # when the current chat's stream started (for time behind)
        if self.recording:
            self.span.set_attributes({c.OPERATION: "invoke_agent", c.AGENT_NAME: owner.agent_name})
            if conversation_id:
                self.span.set_attribute(c.CONVERSATION_ID, conversation_id)
            if owner.capture.on_span:
                self.span.set_attribute(c.INPUT_MESSAGES, c.input_messages(messages))

    # --- model calls -------------------------------------------------------------------------
    def chat_started(self, *, model: str, options: Any, messages: Sequence[Any] = ()) -> ChatTrace:
        about = self.owner.describe(model)
        chat = ChatTrace(self, about["model"], about["provider"], about["base_url"], options, about["stream"],
                         messages)
        with self._lock:
            self._chats.append(chat)
        return chat

    # --- tools -----------------------------------------------------------------------------------
    def tool_started(self, call: Any, *, kind: str = "function", started_at: Optional[float] = None,
                     hand_over: bool = False) -> Any:
        """Open the call's ``execute_tool`` span (on the thread entering the function); returns its context.

        ``hand_over``: the tool starts itself right after this on this thread (MCP), and takes the
        span with :func:`take_hand_over` to put its own client span under it.
        """
        start = _wall_ns(started_at) if started_at is not None else None
        span = self.owner.tracer.start_span(f"execute_tool {call.name}", context=self.context,
                                            kind=SpanKind.INTERNAL, start_time=start)
        if span.is_recording():
            span.set_attributes({c.OPERATION: "execute_tool", c.TOOL_NAME: call.name, c.TOOL_CALL_ID: call.id,
                                 c.TOOL_TYPE: kind})
            if self.owner.capture.on_span:
                span.set_attribute(c.TOOL_CALL_ARGUMENTS, call.arguments)
        with self._lock:
            self._tools[call.id] = span
        context = trace.set_span_in_context(span, self.context)
        if hand_over:
            _handing_over.pending = (context, self.owner)
        return context

    def tool_ended(self, result: Any, *, remote: bool = False) -> None:
        """Close the call's span with its outcome; a remote tool's span is made here, from the remote duration."""
        with self._lock:
            span = self._tools.pop(result.call_id, None)
        end = None
        if span is None:
            if not remote or not result.duration_s:
                return  # a call that never ran (skipped, refused): no tool span, its result is still told
            end = time.time_ns()
            self.tool_started(_Named(result), started_at=time.monotonic() - result.duration_s)
            with self._lock:
                span = self._tools.pop(result.call_id)
        attributes: Dict[str, Any] = {c.TOOL_NAME: result.name}
        if span.is_recording():
            if self.owner.capture.on_span and result.ok:
                span.set_attribute(c.TOOL_CALL_RESULT, result.text)
            if not result.ok:
                kind = "timeout" if result.timed_out else "tool_error"
                span.set_attribute(c.ERROR_TYPE, kind)
                span.set_status(self.owner.error_status(kind, result.error))
                attributes[c.ERROR_TYPE] = kind
        self.owner.end_span(span, "ending a tool span", end)
        if result.duration_s:
            self.owner.instruments.tool_duration.record(result.duration_s, attributes)
        if result.queue_wait_s:
            self.owner.instruments.tool_queue_wait.record(result.queue_wait_s, {c.TOOL_NAME: result.name})
        behind = self._time_behind_answer(result)
        if behind is not None:
            self.owner.instruments.tool_behind_answer.record(behind, {c.TOOL_NAME: result.name})

    def _time_behind_answer(self, result: Any) -> Optional[float]:
        """How long the tool ran while the model's stream was still open: the time this engine saves."""
        if not result.started_at or not result.ended_at:
            return None
        with self._lock:
            windows = [(chat.started, chat.ended_at or time.monotonic()) for chat in self._chats]
        overlap = sum(max(0.0, min(end, result.ended_at) - max(start, result.started_at)) for start, end in windows)
        return overlap

    # --- the end ---------------------------------------------------------------------------------
    def ended(self, result: Any = None, *, error: Optional[BaseException] = None, cancelled: bool = False) -> None:
        """Close every span still open (a cancelled run's tools and call included), then the run's; once."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        stop_reason = getattr(getattr(result, "telemetry", None), "stop_reason", None) or (
            "cancelled" if cancelled else None)
        with self._lock:
            leftovers = list(self._tools.values())
            self._tools.clear()
            chats = [chat for chat in self._chats if chat.open]
            provider = next((chat.attributes[c.PROVIDER] for chat in reversed(self._chats) if chat.answered), None)
        unfinished = stop_reason or "cancelled"
        for chat in chats:
            with self.owner.guard("ending a chat span"):
                chat.abandoned(unfinished)
        for span in leftovers:  # tools still running: they did not complete
            with self.owner.guard("ending a tool span"):
                mark_unfinished(span, unfinished)
                span.end()
        attributes: Dict[str, Any] = {c.OPERATION: "invoke_agent", c.AGENT_NAME: self.owner.agent_name}
        if provider:
            attributes[c.PROVIDER] = provider
        if self.recording:
            if provider:
                self.span.set_attribute(c.PROVIDER, provider)
            if stop_reason:
                self.span.set_attribute("streamengine.stop_reason", stop_reason)
            if self.owner.capture.on_span and result is not None:
                self.span.set_attribute(c.OUTPUT_MESSAGES, c.output_messages(result.answer, (), None))
        failure = _run_failure(result, error, stop_reason)
        if failure is not None:
            attributes[c.ERROR_TYPE] = failure[0]
            if self.recording:
                self.span.set_attribute(c.ERROR_TYPE, failure[0])
                self.span.set_status(self.owner.error_status(*failure))
        self.owner.end_span(self.span, "ending the run's span")
        self.owner.instruments.agent_duration.record(time.monotonic() - self.started, attributes)


#: Stop reasons of a run that did not complete: its span is an ERROR with the reason as ``error.type``
#: (``cancelled`` is this engine's own value: the conventions name none for a cancelled operation).
FAILED_STOP_REASONS = frozenset({"cancelled", "llm_error", "llm_error_after_tokens", "internal_error", "output_limit"})


def _run_failure(result: Any, error: Optional[BaseException], stop_reason: Optional[str]) -> Optional[tuple]:
    """The run failed or was cancelled (not: recovered by failover): its error type and message."""
    if error is not None:
        return c.error_type(error), str(error)
    if stop_reason in FAILED_STOP_REASONS:
        return stop_reason, getattr(result, "error", None) or unfinished_text(stop_reason)
    return None


class _Named:
    """A stand-in call for a remote result whose call was never seen starting."""

    def __init__(self, result: Any) -> None:
        self.id, self.name, self.arguments = result.call_id, result.name, ""
