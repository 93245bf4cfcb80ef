"""OpenTelemetry GenAI spans and metrics, read back from the SDK's in-memory exporters.

Every run here goes over real HTTP to a FakeProvider on 127.0.0.1.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any, Dict, List

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, TokenEvent, tool
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s


def block(name: str, args: str) -> str:
    return f'<tool name="{name}">{args}</tool>'


class Telemetry:
    """A tracer and a meter provider of the SDK, each with an in-memory exporter."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def engine(self, fp: FakeProvider, tools=(), **options: Any) -> StreamingEngine:
        config = EngineConfig(**{"models": ["m"], "tool_mode": "inline", "idle_timeout": 5,
                                 "completion_timeout": 10, **options.pop("config", {})})
        return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, config,
                               tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options)

    def finished(self) -> List[Any]:
        return list(self.spans.get_finished_spans())

    def named(self, prefix: str) -> List[Any]:
        return [span for span in self.finished() if span.name.startswith(prefix)]

    def metrics(self) -> Dict[str, List[Any]]:
        out: Dict[str, List[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out


@pytest.fixture
def otel() -> Telemetry:
    return Telemetry()


RAN = {"weather": threading.Event(), "clock": threading.Event()}


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    RAN["weather"].set()
    return f"sunny in {city}"


@tool
def clock(zone: str) -> str:
    """The time in a zone."""
    RAN["clock"].set()
    return f"noon in {zone}"


def _two_rounds(fp: FakeProvider) -> None:
    """Round 1 calls both tools and goes on talking until both ran; round 2 answers."""
    for event in RAN.values():
        event.clear()
    fp.add_turn(s.text("Checking. "), s.text(block("weather", '{"city": "Oslo"}')),
                s.text(block("clock", '{"zone": "UTC"}')), s.wait(RAN["weather"]), s.wait(RAN["clock"]),
                s.text(" one moment"), s.usage(11, 7))
    fp.add_turn(s.text("Sunny, noon."), s.usage(20, 3))


def test_a_two_round_run_with_two_tools(otel):
    with FakeProvider() as fp:
        _two_rounds(fp)
        parent_tracer = otel.tracer_provider.get_tracer("app")
        with parent_tracer.start_as_current_span("POST /chat") as request, \
                otel.engine(fp, [weather, clock], agent_name="helper") as engine:
            result = engine.complete([{"role": "user", "content": "weather and time?"}],
                                     conversation_id="conv-7")
    assert result.answer == "Sunny, noon."
    (run,) = otel.named("invoke_agent")
    chats = sorted(otel.named("chat "), key=lambda span: span.start_time)
    tools = sorted(otel.named("execute_tool"), key=lambda span: span.start_time)
    assert run.name == "invoke_agent helper" and run.kind is SpanKind.INTERNAL
    assert run.parent.span_id == request.get_span_context().span_id
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "helper"
    assert run.attributes["gen_ai.conversation.id"] == "conv-7"
    assert run.attributes["gen_ai.provider.name"] == "openai"
    assert run.status.status_code is StatusCode.UNSET
    assert [span.name for span in chats] == ["chat m", "chat m"]
    assert [span.name for span in tools] == ["execute_tool weather", "execute_tool clock"]
    for span in chats + tools:
        assert span.parent.span_id == run.context.span_id
    first = chats[0]
    assert first.kind is SpanKind.CLIENT
    attributes = dict(first.attributes)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "m" and attributes["gen_ai.request.stream"] is True
    assert attributes["server.address"] == "127.0.0.1" and attributes["server.port"] == fp.port
    assert attributes["gen_ai.usage.input_tokens"] == 11 and attributes["gen_ai.usage.output_tokens"] == 7
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert [event.name for event in first.events] == ["gen_ai.first_chunk"]
    # The tools ran while the model still talked: each tool span starts inside the first chat span.
    for span in tools:
        assert first.start_time < span.start_time < first.end_time
        assert span.kind is SpanKind.INTERNAL
        assert span.attributes["gen_ai.tool.type"] == "function"
        assert span.attributes["gen_ai.tool.call.id"]
    assert chats[1].start_time > max(span.end_time for span in tools)
    # Content is off by default.
    for span in otel.finished():
        assert not {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                    "gen_ai.tool.call.result"} & set(span.attributes)
    metrics = otel.metrics()
    usage = metrics["gen_ai.client.token.usage"]
    assert {point.attributes["gen_ai.token.type"] for point in usage} == {"input", "output"}
    assert sum(point.sum for point in usage if point.attributes["gen_ai.token.type"] == "input") == 31
    assert sum(point.count for point in metrics["gen_ai.client.operation.duration"]) == 2
    assert sum(point.count for point in metrics["gen_ai.client.operation.time_to_first_chunk"]) == 2
    assert sum(point.count for point in metrics["gen_ai.execute_tool.duration"]) == 2
    assert sum(point.count for point in metrics["gen_ai.invoke_agent.duration"]) == 1
    assert sum(point.count for point in metrics["streamengine.tool.time_behind_answer"]) == 2


def test_a_failover_marks_the_failed_attempt_not_the_run(otel):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(503, {"error": {"message": "overloaded"}}))
        fp.add_turn(s.text("fine"))
        with otel.engine(fp, config={"models": ["first", "second"]}) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert result.answer == "fine"
    failed, ok = sorted(otel.named("chat "), key=lambda span: span.start_time)
    assert failed.name == "chat first" and failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "503"
    assert ok.name == "chat second" and ok.status.status_code is StatusCode.UNSET
    (run,) = otel.named("invoke_agent")
    assert run.status.status_code is StatusCode.UNSET and "error.type" not in run.attributes
    durations = otel.metrics()["gen_ai.client.operation.duration"]
    assert {point.attributes.get("error.type") for point in durations} == {"503", None}


def test_a_tool_timeout_is_an_error_on_its_span(otel):
    release = threading.Event()

    @tool(timeout=0.2)
    def slow() -> str:
        """Slow."""
        release.wait(5)
        return "late"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("slow", "{}")))
        fp.add_turn(s.text("gave up"))
        with otel.engine(fp, [slow]) as engine:
            engine.complete([{"role": "user", "content": "q"}])
        release.set()
    (span,) = otel.named("execute_tool")
    assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "timeout"


def test_a_provider_error_fails_the_run_span(otel):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(400, {"error": {"message": "bad request"}}))
        with otel.engine(fp) as engine:
            *_, done = engine.run([{"role": "user", "content": "q"}])
    assert done.result.telemetry.stop_reason == "llm_error"
    (chat,) = otel.named("chat ")
    assert chat.status.status_code is StatusCode.ERROR and chat.attributes["error.type"] == "400"
    (run,) = otel.named("invoke_agent")
    assert run.status.status_code is StatusCode.ERROR and run.attributes["error.type"] == "llm_error"


def test_a_cancelled_run_ends_every_span_it_opened(otel):
    started = threading.Event()
    release = threading.Event()

    @tool
    def wait_here() -> str:
        """Waits."""
        started.set()
        release.wait(5)
        return "done"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("wait_here", "{}")), s.text(" talking"), s.stall())
        with otel.engine(fp, [wait_here]) as engine:
            run = engine.run([{"role": "user", "content": "q"}])
            for event in run:
                if isinstance(event, TokenEvent) and started.wait(5):
                    break
            run.close()
        release.set()
    names = sorted(span.name for span in otel.finished())
    assert names == ["chat m", "execute_tool wait_here", "invoke_agent streamengine"]
    for span in otel.finished():  # none of them completed: each is an ERROR of type "cancelled"
        assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "cancelled"
    (agent,) = otel.named("invoke_agent")
    assert agent.attributes["streamengine.stop_reason"] == "cancelled"
    metrics = otel.metrics()
    for name in ("gen_ai.client.operation.duration", "gen_ai.invoke_agent.duration"):
        assert [point.attributes.get("error.type") for point in metrics[name]] == ["cancelled"]


def test_content_is_captured_only_when_asked(otel, monkeypatch):
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("weather", '{"city": "Oslo"}')))
        fp.add_turn(s.text("Sunny."))
        with otel.engine(fp, [weather], capture_content=True) as engine:
            engine.complete([{"role": "user", "content": "weather?"}])
    (tool_span,) = otel.named("execute_tool")
    assert tool_span.attributes["gen_ai.tool.call.arguments"] == '{"city":"Oslo"}'
    assert tool_span.attributes["gen_ai.tool.call.result"] == "sunny in Oslo"
    first = sorted(otel.named("chat "), key=lambda span: span.start_time)[0]
    assert '"weather?"' in first.attributes["gen_ai.input.messages"]
    assert "Sunny." in sorted(otel.named("chat "), key=lambda span: span.start_time)[1].attributes[
        "gen_ai.output.messages"]

    events_only = Telemetry()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello."))
        with events_only.engine(fp) as engine:
            engine.complete([{"role": "user", "content": "hi"}])
    (chat,) = events_only.named("chat ")
    assert "gen_ai.output.messages" not in chat.attributes
    (event,) = [e for e in chat.events if e.name == "gen_ai.client.inference.operation.details"]
    assert "Hello." in event.attributes["gen_ai.output.messages"]


def test_reasoning_is_recorded_only_with_content_capture_on(otel):
    thought = "The user wants the weather."
    with FakeProvider() as fp:
        for _ in range(2):
            fp.add_turn(s.reasoning(thought), s.text("Sunny."))
        with otel.engine(fp, capture_content=True) as engine:
            engine.complete([{"role": "user", "content": "weather?"}])
        hidden = Telemetry()
        with hidden.engine(fp, capture_content=False) as engine:
            assert engine.complete([{"role": "user", "content": "weather?"}]).reasoning == thought
    (chat,) = otel.named("chat ")
    [answer] = json.loads(chat.attributes["gen_ai.output.messages"])
    assert answer["parts"] == [{"type": "reasoning", "content": thought}, {"type": "text", "content": "Sunny."}]
    (run_span,) = otel.named("invoke_agent")
    assert json.loads(run_span.attributes["gen_ai.output.messages"])[0]["parts"][0] == {
        "type": "reasoning", "content": thought}
    assert hidden.finished(), "the run without content capture exported no spans to look into"
    for span in hidden.finished():
        shown = repr(dict(span.attributes)) + repr([dict(e.attributes or {}) for e in span.events])
        assert "user wants" not in shown, span.name


def test_the_run_span_follows_the_callers_context_onto_another_thread(otel):
    with FakeProvider() as fp:
        fp.add_turn(s.text("hi"))
        tracer = otel.tracer_provider.get_tracer("app")
        with otel.engine(fp) as engine:
            with tracer.start_as_current_span("request") as request:
                events = engine.run([{"role": "user", "content": "q"}])
            drained: List[Any] = []
            worker = threading.Thread(target=lambda: drained.extend(events))
            worker.start()
            worker.join(10)
    (run,) = otel.named("invoke_agent")
    assert run.parent.span_id == request.get_span_context().span_id
    assert drained and trace.get_current_span() is trace.INVALID_SPAN


def first_lines_of_python(probe: str, n: int) -> List[str]:
    """The first ``n`` lines ``probe`` prints in a fresh interpreter (no state of this process)."""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return out.split("\n")[:n]


def test_without_opentelemetry_nothing_is_imported():
    probe = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "from streamengine import EngineConfig, StreamingEngine, ScriptedClient\n"
        "engine = StreamingEngine(ScriptedClient(['hello']), config=EngineConfig(models=['m']))\n"
        "print(engine.complete([{'role': 'user', 'content': 'q'}]).answer)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.')))\n"
    )
    assert first_lines_of_python(probe, 2) == ["hello", "[]"]


def test_a_run_builds_a_trace_only_when_something_would_record_or_pass_it_on():
    """With the API alone (its proxy providers, no SDK) a run starts no span at all, not even a non-recording
    one.  A caller's span in the current context is passed on (the run's spans start, non-recording); once an
    SDK's meter provider is set globally, the first chunk is measured; and an SDK tracer provider set globally
    after the engine was made records the next run's spans (the proxy forwards to it).  Spans are counted where
    the OpenTelemetry API starts them (its ``ProxyTracer``), metrics read from the SDK's in-memory reader."""
    probe = (
        "from opentelemetry import metrics, trace\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from streamengine import EngineConfig, StreamingEngine, ScriptedClient\n"
        "started = []\n"
        "proxy_start_span = trace.ProxyTracer.start_span\n"
        "def counted(self, name, *args, **kwargs):\n"
        "    started.append(name)\n"
        "    return proxy_start_span(self, name, *args, **kwargs)\n"
        "trace.ProxyTracer.start_span = counted\n"
        "engine = StreamingEngine(ScriptedClient(['hello'] * 4), config=EngineConfig(models=['m']))\n"
        "def answer():\n"
        "    return engine.complete([{'role': 'user', 'content': 'q'}]).answer\n"
        "print(answer(), started)\n"
        "caller = trace.NonRecordingSpan(trace.SpanContext(0x1234, 0x5678, is_remote=True))\n"
        "with trace.use_span(caller):\n"
        "    print(answer(), started)\n"
        "reader = InMemoryMetricReader()\n"
        "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "answer()\n"
        "data = reader.get_metrics_data()\n"
        "measured = {m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics}\n"
        "print('gen_ai.client.operation.time_to_first_chunk' in measured)\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "answer()\n"
        "print(sorted(span.name for span in exporter.get_finished_spans()))\n"
    )
    assert first_lines_of_python(probe, 4) == ["hello []", "hello ['invoke_agent streamengine', 'chat m']", "True",
                                               "['chat m', 'invoke_agent streamengine']"]


def test_a_traced_run_leaves_nothing_for_the_garbage_collector(otel):
    """A run's trace and its chats' spans die with the run: a chat that held its run made the two a cycle."""
    from gc_support import left_for_the_collector

    with FakeProvider() as fp:
        _two_rounds(fp)
        with otel.engine(fp, [weather, clock]) as engine:
            list(engine.run([{"role": "user", "content": "warm up"}]))  # imports and pools leave what they leave once
            _two_rounds(fp)
            ours = left_for_the_collector(lambda: list(engine.run([{"role": "user", "content": "weather and time?"}])))
    assert ours == []
    assert [span.name for span in otel.named("invoke_agent")] == ["invoke_agent streamengine"] * 2
