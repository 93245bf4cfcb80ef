"""Telemetry never breaks a run, never shows what content capture keeps out, and says how a run ended.

Every run goes over real HTTP to a FakeProvider on 127.0.0.1, with the
OpenTelemetry SDK's own TracerProvider and MeterProvider.  A span processor
(or an exemplar filter) that raises is the application's bug, but it must
not cost the run an event: each case is compared with the same run without
telemetry.
"""
from __future__ import annotations

import threading
from typing import Any, List, Optional, Tuple

import pytest
from loguru import logger
from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from streamengine import (
    AnthropicClient,
    DoneEvent,
    EngineConfig,
    HeartbeatEvent,
    OpenAICompatibleClient,
    StreamingEngine,
    TokenEvent,
    ToolError,
    ToolResultEvent,
    ToolStartEvent,
    enable_logging,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

QUESTION = [{"role": "user", "content": "weather?"}]


def block(name: str, args: str) -> str:
    return f'<tool name="{name}">{args}</tool>'


class RaisingProcessor(SpanProcessor):
    """A span processor with a bug: raises as spans named ``prefix...`` start or end (``hook``)."""

    def __init__(self, hook: str, prefix: str) -> None:
        self.hook, self.prefix, self.raised = hook, prefix, 0

    def _maybe_raise(self, hook: str, span: Any) -> None:
        if hook == self.hook and span.name.startswith(self.prefix):
            self.raised += 1
            raise RuntimeError(f"processor broke on {span.name}")

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self._maybe_raise("start", span)

    def on_end(self, span: Any) -> None:
        self._maybe_raise("end", span)


class RaisingExemplarFilter(ExemplarFilter):
    """Asked by the SDK inside every ``Histogram.record``: a bug here raises into whoever records."""

    def __init__(self) -> None:
        self.raised = 0

    def should_sample(self, value: Any, time_unix_nano: int, attributes: Any, context: Any) -> bool:
        self.raised += 1
        raise RuntimeError("exemplar filter broke")


class Telemetry:
    def __init__(self, processor: Optional[SpanProcessor] = None, exemplar_filter: Any = None) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))  # first: sees every span
        if processor is not None:
            self.tracer_provider.add_span_processor(processor)
        self.reader = InMemoryMetricReader()
        extra = {"exemplar_filter": exemplar_filter} if exemplar_filter is not None else {}
        self.meter_provider = MeterProvider(metric_readers=[self.reader], **extra)

    def named(self, prefix: str) -> List[Any]:
        return sorted((span for span in self.spans.get_finished_spans() if span.name.startswith(prefix)),
                      key=lambda span: span.start_time)


@pytest.fixture
def logged() -> Any:
    """streamengine's log lines at WARNING and above, for the test's length."""
    lines: List[str] = []
    handler = enable_logging(level="WARNING", sink=lines.append)
    yield lines
    logger.remove(handler)
    logger.disable("streamengine")


def telemetry_warnings(lines: List[str]) -> List[str]:
    return [line for line in lines if "OpenTelemetry" in line]


RAN = threading.Event()


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    RAN.set()
    return f"sunny in {city}"


def script(fp: FakeProvider) -> None:
    """Round 1 calls weather mid-stream and talks on until it ran; round 2 answers."""
    RAN.clear()
    fp.add_turn(s.text("Checking. "), s.text(block("weather", '{"city": "Oslo"}')), s.wait(RAN), s.text(" one moment"))
    fp.add_turn(s.text("Sunny."))


def engine_for(fp: FakeProvider, telemetry: Optional[Telemetry], **kwargs: Any) -> StreamingEngine:
    config = EngineConfig(models=["m"], tool_mode="inline", idle_timeout=5, completion_timeout=10)
    if telemetry is not None:
        kwargs.update(tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), kwargs.pop("tools", [weather]), config, **kwargs)


def summary(events: List[Any]) -> Tuple[Any, ...]:
    """What a run told, independent of how tokens and tool events happened to interleave."""
    assert isinstance(events[-1], DoneEvent)
    told = sorted(
        (event.name, event.call.name, event.call.arguments) if isinstance(event, ToolStartEvent)
        else (event.name, event.result.name, event.result.ok, event.result.text) if isinstance(event, ToolResultEvent)
        else (event.name,)
        for event in events if not isinstance(event, (TokenEvent, HeartbeatEvent, DoneEvent)))
    result = events[-1].result
    started = {event.call.id for event in events if isinstance(event, ToolStartEvent)}
    results = {event.result.call_id for event in events if isinstance(event, ToolResultEvent)}
    assert started == results, "every started tool is told its result"
    text = "".join(event.text for event in events if isinstance(event, TokenEvent))
    return tuple(told), text, result.answer, result.telemetry.stop_reason, result.telemetry.tools_ok


def reference_run() -> Tuple[Any, ...]:
    with FakeProvider() as fp:
        script(fp)
        with engine_for(fp, None) as engine:
            return summary(list(engine.run(QUESTION)))


def traced_run(telemetry: Telemetry) -> Tuple[Any, ...]:
    with FakeProvider() as fp:
        script(fp)
        with engine_for(fp, telemetry) as engine:
            return summary(list(engine.run(QUESTION)))


# -- a raising span processor or exemplar filter ------------------------------------------------

@pytest.mark.parametrize("hook, prefix", [
    ("end", "execute_tool"),   # lost the tool_result
    ("end", "chat"),           # ended internal_error, a started tool never told
    ("start", "invoke_agent"),  # run() raised before any event
    ("start", "chat"),
    ("start", "execute_tool"),
    ("end", "invoke_agent"),
], ids=lambda value: value)
def test_a_raising_span_processor_leaves_the_run_as_it_would_be_without_telemetry(hook, prefix, logged):
    expected = reference_run()
    processor = RaisingProcessor(hook, prefix)
    telemetry = Telemetry(processor)
    assert traced_run(telemetry) == expected
    assert processor.raised >= 1
    (warning,) = telemetry_warnings(logged)  # once, though it raised for every such span
    assert "processor broke" in warning and "RuntimeError" in warning


def test_a_processor_raising_for_every_span_of_two_runs_is_logged_once_per_place(logged):
    processor = RaisingProcessor("end", "chat")
    telemetry = Telemetry(processor)
    expected = reference_run()
    with FakeProvider() as fp, engine_for(fp, telemetry) as engine:
        for _ in range(2):
            script(fp)
            assert summary(list(engine.run(QUESTION))) == expected
    assert processor.raised == 4  # two chat spans a run
    assert len(telemetry_warnings(logged)) == 1


def test_the_spans_a_raising_processor_did_not_break_are_still_recorded():
    telemetry = Telemetry(RaisingProcessor("end", "execute_tool"))
    traced_run(telemetry)
    (run,) = telemetry.named("invoke_agent")
    assert [span.name for span in telemetry.named("chat")] == ["chat m", "chat m"]
    assert [span.name for span in telemetry.named("execute_tool")] == ["execute_tool weather"]
    assert run.attributes["gen_ai.provider.name"] == "openai"


def test_a_raising_exemplar_filter_breaks_neither_the_run_nor_the_spans(logged):
    expected = reference_run()
    broken = RaisingExemplarFilter()
    telemetry = Telemetry(exemplar_filter=broken)
    assert traced_run(telemetry) == expected
    assert broken.raised >= 4  # time to first chunk, tool duration, chat durations, run duration...
    assert len(telemetry.named("chat")) == 2 and len(telemetry.named("invoke_agent")) == 1
    (warning,) = telemetry_warnings(logged)
    assert "exemplar filter broke" in warning


# -- content capture: error texts and bodies -------------------------------------------------

@tool
def vault(door: str) -> str:
    """Opens a door."""
    raise ToolError(f"door {door} is locked with code 4711")


@pytest.mark.parametrize("capture", [False, True])
def test_a_failed_tools_exception_text_reaches_its_span_only_with_content_capture(capture):
    telemetry = Telemetry()
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("vault", '{"door": "north"}')))
        fp.add_turn(s.text("It is locked."))
        with engine_for(fp, telemetry, tools=[vault], capture_content=capture) as engine:
            engine.complete(QUESTION)
    (span,) = telemetry.named("execute_tool")
    assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "tool_error"
    if capture:
        assert "4711" in span.status.description
    else:
        assert span.status.description == "tool_error"


@pytest.mark.parametrize("capture", [False, True])
def test_a_providers_error_body_reaches_the_spans_only_with_content_capture(capture):
    telemetry = Telemetry()
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(400, {"error": {"message": "quota of org-secret-77 exhausted"}}))
        with engine_for(fp, telemetry, capture_content=capture) as engine:
            result = engine.complete(QUESTION, raise_on_error=False)
    assert "org-secret-77" in result.error  # the caller still reads it
    (chat,) = telemetry.named("chat")
    (run,) = telemetry.named("invoke_agent")
    assert (chat.attributes["error.type"], run.attributes["error.type"]) == ("400", "llm_error")
    for span in (chat, run):
        assert span.status.status_code is StatusCode.ERROR
        if capture:
            assert "org-secret-77" in span.status.description
        else:
            assert span.status.description == span.attributes["error.type"]


# -- a cancelled run (left early: tests/otel/test_otel.py) -------------------------------------------

def _assert_cancelled(span: Any) -> None:
    assert span.status.status_code is StatusCode.ERROR, span.name
    assert span.attributes["error.type"] == "cancelled", span.name


def test_a_run_cancelled_by_its_callers_event_ends_its_spans_as_cancelled_errors():
    cancel = threading.Event()
    telemetry = Telemetry()
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello"), s.stall())
        with engine_for(fp, telemetry) as engine:
            events = []
            for event in engine.run(QUESTION, cancel):
                events.append(event)
                if isinstance(event, TokenEvent):
                    cancel.set()
    assert events[-1].result.telemetry.stop_reason == "cancelled"
    (agent,) = telemetry.named("invoke_agent")
    (chat,) = telemetry.named("chat")
    _assert_cancelled(agent)
    _assert_cancelled(chat)
    (point,) = _metrics(telemetry, "gen_ai.invoke_agent.duration")
    assert point.attributes["error.type"] == "cancelled"


def _metrics(telemetry: Telemetry, name: str) -> List[Any]:
    points: List[Any] = []
    for resource in telemetry.reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


# -- time to first chunk ------------------------------------------------------------------------

PAUSE = 0.3


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_time_to_first_chunk_waits_for_the_first_meaningful_chunk_not_an_empty_delta(wire):
    """The provider sends its empty first frame (a role delta; Anthropic's message_start) at once, pauses,
    then text: the first chunk is the text."""
    telemetry = Telemetry()
    with FakeProvider(wire=wire) as fp:
        fp.add_turn(s.empty_delta(), s.delay(PAUSE), s.text("hi"))
        client = OpenAICompatibleClient(fp.base_url) if wire == "openai" else AnthropicClient(fp.base_url)
        config = EngineConfig(models=["m"], idle_timeout=5, completion_timeout=10)
        with StreamingEngine(client, config=config, tracer_provider=telemetry.tracer_provider,
                             meter_provider=telemetry.meter_provider) as engine:
            assert engine.complete(QUESTION).answer == "hi"
    (chat,) = telemetry.named("chat")
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] >= PAUSE
    (point,) = _metrics(telemetry, "gen_ai.client.operation.time_to_first_chunk")
    assert point.min >= PAUSE
