"""OpenTelemetry GenAI spans and metrics of a run: the conventions, the guard, the instruments, the spans.

Imported only through :func:`streamengine._otel.instrumentation` when
``opentelemetry-api`` is installed; every hook runs behind a :class:`Guard`
so a failing exporter never fails a run.

The OpenTelemetry GenAI semantic conventions this engine follows: names, values, and what is captured.

One home for every attribute name, so a span and a metric never spell one
differently.  The conventions are still marked *development*; the names here
are those of semantic-conventions 1.37+ (``gen_ai.provider.name`` rather than
the older ``gen_ai.system``).

Telemetry never breaks a run: every call into OpenTelemetry is guarded, and a failure is logged once.

An SDK runs the application's own code inside the engine's calls: span
processors in ``start_span`` and ``end``, exemplar filters and views in
``record``.  A bug there raised into the run (a tool's result lost, a run
ended ``internal_error``, ``run()`` failing before its first event).  So the
engine's hooks run under a :class:`Guard`: what raises is logged (once per
engine for each place and exception type, never per chunk or per span) and
the run goes on with what telemetry it still has.

The histograms a run records: the GenAI conventions' own and the engine's, under ``streamengine.``.

Bucket boundaries follow the conventions' advice for durations (seconds, up
to ~80 s) and token counts (powers of four, up to ~67 M).  Each is guarded
(``guard.GuardedHistogram``): what the SDK runs inside ``record`` cannot raise
into the run.

The ``chat {model}`` span of one model call, and how a span the run's end cut short is marked.

Started and ended on the thread that drives the run; a call the run's end
left open (a cancel) is an ERROR whose ``error.type`` is the run's stop reason
(``cancelled``: this engine's own value, documented in docs/observability.md,
as the conventions name none for a cancelled operation).

Spans and metrics of one run: ``invoke_agent`` over ``chat`` per model call and ``execute_tool`` per tool.

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

import json
import os
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Type, Union
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from .._logs import component_logger
from .._messages import StopReason
from .._parts import Part, TextPart

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, Meter, MeterProvider
    from opentelemetry.trace import TracerProvider

    from .._engine.result import EngineResult
    from .._messages import CompletionOptions, Message, Response, ToolCall, ToolResult, Usage

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_STREAM = "gen_ai.request.stream"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
USAGE_INPUT = "gen_ai.usage.input_tokens"
USAGE_OUTPUT = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
USAGE_REASONING = "gen_ai.usage.reasoning.output_tokens"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOKEN_TYPE = "gen_ai.token.type"

#: The event the conventions give for content recorded as an event rather than on the span.
CONTENT_EVENT = "gen_ai.client.inference.operation.details"
#: The event marking the first meaningful chunk of a streamed call.
FIRST_CHUNK_EVENT = "gen_ai.first_chunk"

#: The conventions' metric names (histograms) and the engine's own, under ``streamengine.``.
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
METRIC_AGENT_DURATION = "gen_ai.invoke_agent.duration"
METRIC_TOOL_DURATION = "gen_ai.execute_tool.duration"
METRIC_TOOL_BEHIND_ANSWER = "streamengine.tool.time_behind_answer"
METRIC_TOOL_QUEUE_WAIT = "streamengine.tool.queue_wait"

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


class Capture:
    """Where message content goes: nowhere (the default), on the span, as an event, or both."""

    def __init__(self, on_span: bool, as_event: bool) -> None:
        self.on_span = on_span
        self.as_event = as_event

    @property
    def any(self) -> bool:
        return self.on_span or self.as_event

    @classmethod
    def resolve(cls, capture_content: Optional[bool], environ: Optional[Dict[str, str]] = None) -> Capture:
        """``capture_content=True/False`` wins; otherwise the environment variable, read as the conventions do.

        ``true`` (any case) means on the span, as opentelemetry-instrumentation-openai-v2
        reads it; the newer values ``SPAN_ONLY``, ``EVENT_ONLY``, ``SPAN_AND_EVENT``
        and ``NO_CONTENT`` are understood too; anything else captures nothing.
        """
        if capture_content is not None:
            return cls(bool(capture_content), False)
        value = (environ if environ is not None else os.environ).get(CAPTURE_ENV, "").strip().upper()
        return {"TRUE": cls(True, False), "SPAN_ONLY": cls(True, False), "EVENT_ONLY": cls(False, True),
                "SPAN_AND_EVENT": cls(True, True)}.get(value, cls(False, False))


def provider_of(client: object) -> str:
    """``gen_ai.provider.name``: the client's own ``provider_name`` if it has one, else by its wire."""
    named = getattr(client, "provider_name", None)
    if isinstance(named, str) and named:
        return named
    kind = type(client).__name__
    if "Anthropic" in kind:
        return "anthropic"
    if "OpenAI" in kind:
        return "openai"
    return kind


def server_of(base_url: Optional[str]) -> Dict[str, Any]:
    """``server.address`` / ``server.port`` of a provider's base URL (the default port filled in)."""
    if not base_url:
        return {}
    parts = urlsplit(base_url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port}


def error_type(exc: BaseException) -> str:
    """Low-cardinality, as the conventions ask: an HTTP status code, else the exception's class name."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return str(status)
    return type(exc).__name__


def request_attributes(options: Optional[CompletionOptions]) -> Dict[str, Any]:
    """The request settings the conventions name, when they are set."""
    out: Dict[str, Any] = {}
    for field, key in (("max_tokens", REQUEST_MAX_TOKENS), ("temperature", REQUEST_TEMPERATURE),
                       ("top_p", REQUEST_TOP_P)):
        value = getattr(options, field, None)
        if value is not None:
            out[key] = value
    return out


def usage_attributes(usage: Optional[Usage]) -> Dict[str, int]:
    """Token counts the provider sent; optional ones only when it sent them."""
    if usage is None:
        return {}
    out = {USAGE_INPUT: int(getattr(usage, "prompt_tokens", 0) or 0),
           USAGE_OUTPUT: int(getattr(usage, "completion_tokens", 0) or 0)}
    for field, key in (("cached_tokens", USAGE_CACHE_READ), ("reasoning_tokens", USAGE_REASONING)):
        value = getattr(usage, field, None)
        if value:
            out[key] = int(value)
    return out


def input_messages(messages: Iterable[Message]) -> str:
    """The conventions' JSON form of a conversation: ``[{"role": ..., "parts": [...]}]``."""
    out: List[Dict[str, Any]] = []
    for message in messages:
        parts: List[Dict[str, Any]] = []
        if getattr(message, "parts", ()):
            parts += [media_part(part) for part in message.parts]
        elif getattr(message, "content", ""):
            kind = "tool_call_response" if message.role == "tool" else "text"
            part: Dict[str, Any] = {"type": kind, ("response" if kind != "text" else "content"): message.content}
            if kind != "text":
                part["id"] = message.tool_call_id
            parts.append(part)
        for call in getattr(message, "tool_calls", ()) or ():
            parts.append(_tool_call_part(call))
        out.append({"role": message.role, "parts": parts})
    return json.dumps(out, ensure_ascii=False)


def media_part(part: Part) -> Dict[str, Any]:
    """A content part as captured: text as text, an image, audio or a file as its kind, type and size only.

    Never its bytes or its URL: a span is no place for a photo, and a URL may
    carry a signature that grants access to it.
    """
    if isinstance(part, TextPart):
        return {"type": "text", "content": part.text}
    out: Dict[str, Any] = {"type": part.kind, "mime_type": part.media_type}
    if part.size:
        out["size"] = part.size
    return out


def output_messages(text: str, calls: Iterable[ToolCall], finish_reason: Optional[str],
                    reasoning: Optional[str] = None) -> str:
    """The conventions' JSON form of an answer; a thinking model's reasoning is its first part (``reasoning``)."""
    parts: List[Dict[str, Any]] = [{"type": "reasoning", "content": reasoning}] if reasoning else []
    parts += [{"type": "text", "content": text}] if text else []
    parts += [_tool_call_part(call) for call in calls]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": finish_reason or StopReason.STOP}],
                      ensure_ascii=False)


def _tool_call_part(call: Union[ToolCall, _Named]) -> Dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = call.arguments
    return {"type": "tool_call", "id": call.id, "name": call.name, "arguments": arguments}


def finish_reasons(reason: Optional[str]) -> Tuple[str, ...]:
    return (reason,) if reason else ()


_log = component_logger("streamengine.otel")


class Guard:
    """One per engine: ``with guard("ending a chat span"): ...`` runs the block, swallowing and telling errors."""

    def __init__(self) -> None:
        self._told: Set[Tuple[str, type]] = set()
        self._lock = threading.Lock()

    def __call__(self, where: str) -> _Guarded:
        return _Guarded(self, where)

    def failed(self, where: str, exc: Exception) -> None:
        """Log ``exc`` the first time this place fails with this type; later ones are only swallowed."""
        key = (where, type(exc))
        with self._lock:
            if key in self._told:
                return
            self._told.add(key)
        _log.opt(exception=exc).warning(
            "OpenTelemetry failed while {} ({}: {}); the run goes on, its telemetry may be incomplete. "
            "Fix the span processor, exporter, view or exemplar filter that raised; this is logged once",
            where, type(exc).__name__, exc)


class _Guarded:
    """The context of one guarded block (a class, not a generator: it is entered per span, not per chunk)."""

    __slots__ = ("guard", "where")

    def __init__(self, guard: Guard, where: str) -> None:
        self.guard = guard
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> bool:
        if isinstance(exc, Exception):  # never a KeyboardInterrupt or a generator's exit
            self.guard.failed(self.where, exc)
            return True
        return False


class GuardedHistogram:
    """A histogram whose ``record`` cannot raise into the run (an exemplar filter or view may)."""

    __slots__ = ("_guard", "_histogram")

    def __init__(self, histogram: Histogram, guard: Guard) -> None:
        self._histogram = histogram
        self._guard = guard

    def record(self, amount: float, attributes: Optional[Dict[str, Any]] = None) -> None:
        try:
            self._histogram.record(amount, attributes)
        except Exception as exc:  # one place for every histogram: what breaks one breaks them all
            self._guard.failed("recording a metric", exc)


_SECONDS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
_TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]


class Instruments:
    """Made once per engine from the meter provider given (or the global one)."""

    def __init__(self, meter_provider: Optional[MeterProvider], version: str, guard: Guard) -> None:
        meter = metrics.get_meter("streamengine", version, meter_provider=meter_provider)

        def histogram(name: str, unit: str, description: str, boundaries: Sequence[float]) -> GuardedHistogram:
            return GuardedHistogram(_made(meter, name, unit, description, boundaries), guard)

        self.operation_duration = histogram(METRIC_OPERATION_DURATION, "s", "GenAI operation duration", _SECONDS)
        self.token_usage = histogram(METRIC_TOKEN_USAGE, "{token}", "Number of input and output tokens used",
                                     _TOKENS)
        self.time_to_first_chunk = histogram(METRIC_TIME_TO_FIRST_CHUNK, "s",
                                             "Time to the first meaningful chunk of a streamed response", _SECONDS)
        self.agent_duration = histogram(METRIC_AGENT_DURATION, "s", "Duration of one engine run", _SECONDS)
        self.tool_duration = histogram(METRIC_TOOL_DURATION, "s", "Duration of one tool call", _SECONDS)
        self.tool_behind_answer = histogram(
            METRIC_TOOL_BEHIND_ANSWER, "s",
            "Time a tool ran while the model's answer was still streaming (the time the engine saved)", _SECONDS)
        self.tool_queue_wait = histogram(METRIC_TOOL_QUEUE_WAIT, "s", "Time a tool call waited for a worker",
                                         _SECONDS)


def _made(meter: Meter, name: str, unit: str, description: str, boundaries: Sequence[float]) -> Histogram:
    try:
        return meter.create_histogram(name, unit=unit, description=description,
                                      explicit_bucket_boundaries_advisory=boundaries)
    except TypeError:  # opentelemetry-api before 1.23 has no bucket advice
        return meter.create_histogram(name, unit=unit, description=description)


def unfinished_text(reason: str) -> str:
    """A status description that names no content: what ended the run, in the engine's words."""
    return "the run was cancelled" if reason == StopReason.CANCELLED else f"the run stopped: {reason}"


def mark_unfinished(span: Span, reason: str) -> None:
    """A span whose operation the run's end cut short: ERROR, ``error.type`` the run's stop reason."""
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, reason)
        span.set_status(Status(StatusCode.ERROR, unfinished_text(reason)))


class ChatTrace:
    """The ``chat {model}`` span of one model call (one failover attempt)."""

    def __init__(self, run: RunTrace, model: str, provider: str, base_url: Optional[str],
                 options: Optional[CompletionOptions], stream: bool, messages: Sequence[Message]) -> None:
        # The run's instrumentation, not the run: the run holds its chats, and a chat that held the run
        # back would make the two a cycle, left to the garbage collector after every run.
        self.owner = run.owner
        self.answered = False  # the provider answered: the run's span names it
        self.started = time.monotonic()
        self.ended_at: Optional[float] = None
        self.first_chunk_at: Optional[float] = None
        self.open = True
        self.attributes: Dict[str, Any] = {OPERATION: "chat", PROVIDER: provider, REQUEST_MODEL: model,
                                           **server_of(base_url)}
        self.span = self.owner.tracer.start_span(f"chat {model}", context=run.context, kind=SpanKind.CLIENT)
        if self.span.is_recording():
            self.span.set_attributes({**self.attributes, REQUEST_STREAM: stream,
                                      **request_attributes(options)})
            if self.owner.capture.on_span and messages:
                self.span.set_attribute(INPUT_MESSAGES, input_messages(messages))

    def first_chunk(self) -> None:
        """The first *meaningful* chunk arrived (a keep-alive or an empty role delta is not one)."""
        if self.first_chunk_at is not None:
            return
        self.first_chunk_at = time.monotonic()
        ttfc = self.first_chunk_at - self.started
        if self.span.is_recording():
            self.span.set_attribute(RESPONSE_TIME_TO_FIRST_CHUNK, ttfc)
            self.span.add_event(FIRST_CHUNK_EVENT, {RESPONSE_TIME_TO_FIRST_CHUNK: ttfc})
        self.owner.instruments.time_to_first_chunk.record(ttfc, self.attributes)

    def succeeded(self, response: Response) -> None:
        self.answered = True
        metric = dict(self.attributes)
        if response.model:
            metric[RESPONSE_MODEL] = response.model
        if self.span.is_recording():
            if response.model:
                self.span.set_attribute(RESPONSE_MODEL, response.model)
            response_id = getattr(response, "id", None)
            if response_id:
                self.span.set_attribute(RESPONSE_ID, response_id)
            self.span.set_attribute(RESPONSE_FINISH_REASONS, finish_reasons(response.finish_reason))
            self.span.set_attributes(usage_attributes(response.usage))
            self._capture_output(response)
        self._record_usage(response.usage, metric)
        self._end(metric)

    def failed(self, exc: BaseException) -> None:
        kind = error_type(exc)
        if self.span.is_recording():
            self.span.set_attribute(ERROR_TYPE, kind)
            self.span.set_status(self.owner.error_status(kind, str(exc)))
        self._end({**self.attributes, ERROR_TYPE: kind})

    def abandoned(self, why: str) -> None:
        """The call did not complete (cancelled, or the run ended under it): an ERROR with ``why`` as its type."""
        if self.span.is_recording():
            self.span.set_attribute("streamengine.stop_reason", why)
        mark_unfinished(self.span, why)
        self._end({**self.attributes, ERROR_TYPE: why})

    def _capture_output(self, response: Response) -> None:
        capture = self.owner.capture
        if not capture.any:
            return
        output = output_messages(response.content, response.tool_calls, response.finish_reason, response.reasoning)
        if capture.on_span:
            self.span.set_attribute(OUTPUT_MESSAGES, output)
        if capture.as_event:
            self.span.add_event(CONTENT_EVENT, {OUTPUT_MESSAGES: output})

    def _record_usage(self, usage: Optional[Usage], attributes: Dict[str, Any]) -> None:
        if usage is None:
            return
        histogram = self.owner.instruments.token_usage
        histogram.record(usage.prompt_tokens, {**attributes, TOKEN_TYPE: "input"})
        histogram.record(usage.completion_tokens, {**attributes, TOKEN_TYPE: "output"})

    def _end(self, metric: Dict[str, Any]) -> None:
        if not self.open:
            return
        self.open = False
        self.ended_at = time.monotonic()
        self.owner.end_span(self.span, "ending a chat span")
        self.owner.instruments.operation_duration.record(self.ended_at - self.started, metric)


SCOPE = "streamengine"

#: The tool span of a call being handed over on this thread (a tool that starts itself, e.g. MCP):
#: set by the start hook, taken by the tool as it starts, so its own client span nests under it.
_handing_over = threading.local()

#: A tool span handed over to the tool that starts itself: its context and the run's instrumentation.
HandOver = Tuple[Context, "Instrumentation"]
#: An MCP client span (None when its start failed) and the instrumentation that ends it.
McpSpan = Tuple[Optional[Span], "Instrumentation"]


def take_hand_over() -> Optional[HandOver]:
    """``(context, instrumentation)`` of the tool span being handed over on this thread, once; else None."""
    pending: Optional[HandOver] = getattr(_handing_over, "pending", None)
    _handing_over.pending = None
    return pending


def mcp_client_span(pending: HandOver, tool_name: str, transport: str) -> Tuple[McpSpan, Dict[str, str]]:
    """The MCP client span (``tools/call {tool}``) under the call's tool span, and its ``_meta`` carrier."""
    from opentelemetry import propagate
    parent, owner = pending
    span: Optional[Span] = None
    carrier: Dict[str, str] = {}
    with owner.guard("starting an MCP client span"):
        span = owner.tracer.start_span(f"tools/call {tool_name}", context=parent, kind=SpanKind.CLIENT)
        if span.is_recording():
            span.set_attributes({"mcp.method.name": "tools/call", TOOL_NAME: tool_name,
                                 OPERATION: "execute_tool", "network.transport": transport})
        propagate.inject(carrier, context=trace.set_span_in_context(span, parent))
    return (span, owner), carrier


def end_mcp_client_span(handle: McpSpan, error: Optional[BaseException]) -> None:
    """End the span :func:`mcp_client_span` made (none when its start failed), with the call's error."""
    span, owner = handle
    if span is None:
        return
    with owner.guard("ending an MCP client span"):
        if error is not None:
            kind = type(error).__name__
            span.set_attribute(ERROR_TYPE, kind)
            span.set_status(owner.error_status(kind, str(error)))
        span.end()


def _api_own(provider: object, api_module: str) -> bool:
    """Whether ``provider`` is one of the API's own, which record nothing: its no-op one, or the proxy a
    ``get_*_provider()`` returns until an SDK's is set (``ProxyTracerProvider``, ``_ProxyMeterProvider``:
    names that have changed before), told by the module they are defined in."""
    return type(provider).__module__.startswith(api_module)


def _wall_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` reading as epoch nanoseconds (what span timestamps are)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class Instrumentation:
    """One per engine: the tracer, the instruments, and what to capture."""

    def __init__(self, *, agent_name: str, capture: Capture, tracer_provider: Optional[TracerProvider] = None,
                 meter_provider: Optional[MeterProvider] = None, version: str = "", client: object = None) -> None:
        self.agent_name = agent_name
        self.capture = capture
        self.client = client
        self.tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        self.guard = Guard()
        self.instruments = Instruments(meter_provider, version, self.guard)
        self._meter_given = meter_provider is not None
        self._tracer_given = tracer_provider is not None

    def live(self, parent: Optional[Context]) -> bool:
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

    def end_span(self, span: Span, where: str, end_time: Optional[int] = None) -> None:
        """``span.end()``, where the SDK runs the span processors' ``on_end``: guarded."""
        with self.guard(where):
            span.end(end_time=end_time)

    @staticmethod
    def current_context() -> Context:
        """The context current in the calling thread: a run's span is parented to it."""
        return otel_context.get_current()

    def start_run(self, *, parent: Optional[Context], conversation_id: Optional[str],
                  messages: Sequence[Message]) -> RunTrace:
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
        return {"provider": provider_of(client), "base_url": getattr(client, "base_url", None),
                "stream": callable(getattr(client, "stream", None)), "model": name or model}


class RunTrace:
    """The ``invoke_agent`` span of one run and everything under it."""

    def __init__(self, owner: Instrumentation, parent: Optional[Context], conversation_id: Optional[str],
                 messages: Sequence[Message]) -> None:
        self.owner = owner
        self.started = time.monotonic()
        span: Span = INVALID_SPAN  # a span that failed to start: its children go under the caller's
        with owner.guard("starting the run's span"):
            span = owner.tracer.start_span(f"invoke_agent {owner.agent_name}", context=parent, kind=SpanKind.INTERNAL)
        self.span = span
        self.context = parent if span is INVALID_SPAN else trace.set_span_in_context(span, parent)
        self.recording = span.is_recording()
        #: Whether per-chunk work (the first meaningful chunk) is worth doing: nothing records it otherwise.
        self.watches_chunks = self.recording or owner.metrics_live()
        self._tools: Dict[str, Span] = {}
        self._chats: List[ChatTrace] = []
        self._lock = threading.Lock()  # tool spans are opened and closed from tool workers
        self._ended = False
        self._stream_open: Optional[float] = None  # when the current chat's stream started (for time behind)
        if self.recording:
            self.span.set_attributes({OPERATION: "invoke_agent", AGENT_NAME: owner.agent_name})
            if conversation_id:
                self.span.set_attribute(CONVERSATION_ID, conversation_id)
            if owner.capture.on_span:
                self.span.set_attribute(INPUT_MESSAGES, input_messages(messages))

    # --- model calls -------------------------------------------------------------------------
    def chat_started(self, *, model: str, options: Optional[CompletionOptions],
                     messages: Sequence[Message] = ()) -> ChatTrace:
        about = self.owner.describe(model)
        chat = ChatTrace(self, about["model"], about["provider"], about["base_url"], options, about["stream"],
                         messages)
        with self._lock:
            self._chats.append(chat)
        return chat

    # --- tools -----------------------------------------------------------------------------------
    def tool_started(self, call: Union[ToolCall, _Named], *, kind: str = "function",
                     started_at: Optional[float] = None, hand_over: bool = False) -> Context:
        """Open the call's ``execute_tool`` span (on the thread entering the function); returns its context.

        ``hand_over``: the tool starts itself right after this on this thread (MCP), and takes the
        span with :func:`take_hand_over` to put its own client span under it.
        """
        start = _wall_ns(started_at) if started_at is not None else None
        span = self.owner.tracer.start_span(f"execute_tool {call.name}", context=self.context,
                                            kind=SpanKind.INTERNAL, start_time=start)
        if span.is_recording():
            span.set_attributes({OPERATION: "execute_tool", TOOL_NAME: call.name, TOOL_CALL_ID: call.id,
                                 TOOL_TYPE: kind})
            if self.owner.capture.on_span:
                span.set_attribute(TOOL_CALL_ARGUMENTS, call.arguments)
        with self._lock:
            self._tools[call.id] = span
        context = trace.set_span_in_context(span, self.context)
        if hand_over:
            _handing_over.pending = (context, self.owner)
        return context

    def tool_ended(self, result: ToolResult, *, remote: bool = False) -> None:
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
        attributes: Dict[str, Any] = {TOOL_NAME: result.name}
        if span.is_recording():
            if self.owner.capture.on_span and result.ok:
                span.set_attribute(TOOL_CALL_RESULT, result.text)
            if not result.ok:
                kind = "timeout" if result.timed_out else "tool_error"
                span.set_attribute(ERROR_TYPE, kind)
                span.set_status(self.owner.error_status(kind, result.error))
                attributes[ERROR_TYPE] = kind
        self.owner.end_span(span, "ending a tool span", end)
        if result.duration_s:
            self.owner.instruments.tool_duration.record(result.duration_s, attributes)
        if result.queue_wait_s:
            self.owner.instruments.tool_queue_wait.record(result.queue_wait_s, {TOOL_NAME: result.name})
        behind = self._time_behind_answer(result)
        if behind is not None:
            self.owner.instruments.tool_behind_answer.record(behind, {TOOL_NAME: result.name})

    def _time_behind_answer(self, result: ToolResult) -> Optional[float]:
        """How long the tool ran while the model's stream was still open: the time this engine saves."""
        if not result.started_at or not result.ended_at:
            return None
        with self._lock:
            windows = [(chat.started, chat.ended_at or time.monotonic()) for chat in self._chats]
        overlap: float = sum(max(0.0, min(end, result.ended_at) - max(start, result.started_at))
                             for start, end in windows)
        return overlap

    # --- the end ---------------------------------------------------------------------------------
    def ended(self, result: Optional[EngineResult] = None, *, error: Optional[BaseException] = None,
              cancelled: bool = False) -> None:
        """Close every span still open (a cancelled run's tools and call included), then the run's; once."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        stop_reason = getattr(getattr(result, "telemetry", None), "stop_reason", None) or (
            StopReason.CANCELLED if cancelled else None)
        with self._lock:
            leftovers = list(self._tools.values())
            self._tools.clear()
            chats = [chat for chat in self._chats if chat.open]
            provider = next((chat.attributes[PROVIDER] for chat in reversed(self._chats) if chat.answered), None)
        unfinished = stop_reason or StopReason.CANCELLED
        for chat in chats:
            with self.owner.guard("ending a chat span"):
                chat.abandoned(unfinished)
        for span in leftovers:  # tools still running: they did not complete
            with self.owner.guard("ending a tool span"):
                mark_unfinished(span, unfinished)
                span.end()
        attributes: Dict[str, Any] = {OPERATION: "invoke_agent", AGENT_NAME: self.owner.agent_name}
        if provider:
            attributes[PROVIDER] = provider
        if self.recording:
            if provider:
                self.span.set_attribute(PROVIDER, provider)
            if stop_reason:
                self.span.set_attribute("streamengine.stop_reason", stop_reason)
            if self.owner.capture.on_span and result is not None:
                self.span.set_attribute(OUTPUT_MESSAGES, output_messages(result.answer, (), None, result.reasoning))
        failure = _run_failure(result, error, stop_reason)
        if failure is not None:
            attributes[ERROR_TYPE] = failure[0]
            if self.recording:
                self.span.set_attribute(ERROR_TYPE, failure[0])
                self.span.set_status(self.owner.error_status(*failure))
        self.owner.end_span(self.span, "ending the run's span")
        self.owner.instruments.agent_duration.record(time.monotonic() - self.started, attributes)


#: Stop reasons of a run that did not complete: its span is an ERROR with the reason as ``error.type``
#: (``cancelled`` is this engine's own value: the conventions name none for a cancelled operation).
FAILED_STOP_REASONS = frozenset({StopReason.CANCELLED, StopReason.LLM_ERROR, StopReason.LLM_ERROR_AFTER_TOKENS,
                                 StopReason.INTERNAL_ERROR, StopReason.OUTPUT_LIMIT})


def _run_failure(result: Optional[EngineResult], error: Optional[BaseException],
                 stop_reason: Optional[str]) -> Optional[Tuple[str, Optional[str]]]:
    """The run failed or was cancelled (not: recovered by failover): its error type and message."""
    if error is not None:
        return error_type(error), str(error)
    if stop_reason in FAILED_STOP_REASONS:
        return stop_reason, getattr(result, "error", None) or unfinished_text(stop_reason)
    return None


class _Named:
    """A stand-in call for a remote result whose call was never seen starting."""

    def __init__(self, result: ToolResult) -> None:
        self.id, self.name, self.arguments = result.call_id, result.name, ""
