"""MCP tools inside a run: started while the model still talks, gated when they may write, bounded, filed."""
from __future__ import annotations

import json
import sys

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from mcp_servers.support import lab_http, lab_stdio_args, no_mcp_leak, record, server_command  # noqa: F401 - fixtures

from streamengine import (
    DoneEvent,
    EngineConfig,
    OpenAICompatibleClient,
    SqliteRagStore,
    StreamingEngine,
    TokenEvent,
    ToolResultEvent,
    ToolStartEvent,
    tool,
)
from streamengine.mcp import McpServer
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")
Q = [{"role": "user", "content": "question"}]


def block(name, args=None):
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


def engine_for(fp, tools, **config):
    config.setdefault("models", ["m"])
    config.setdefault("idle_timeout", 20.0)
    config.setdefault("completion_timeout", 30.0)
    approve = config.pop("approve", None)
    rag = config.pop("rag", None)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config), approve=approve,
                           rag=rag)


def test_an_mcp_call_starts_on_the_server_before_the_stream_ends(lab_http, record):
    started_on_server = record.watch("start", "early")
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        # The rest of round 1 is only sent once the *server* has entered the handler.
        fp.add_turn(s.text("Looking. " + block("slow", {"seconds": 0.2, "tag": "early"})),
                    s.wait(started_on_server, timeout=20), s.text(" still talking"))
        fp.add_turn(s.text("Done."))
        with engine_for(fp, lab.tools(trust_annotations=True)) as engine:
            events = list(engine.run(Q))
    assert started_on_server.is_set()
    start = next(i for i, e in enumerate(events) if isinstance(e, ToolStartEvent))
    later = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent) and "still talking" in e.text)
    assert start < later
    result = events[-1].result
    assert isinstance(events[-1], DoneEvent) and result.answer == "Done."
    assert result.tool_results[0].text == "slow early done"
    assert "slow early done" in fp.requests[1].json["messages"][-1]["content"]


def test_native_tool_calls_reach_mcp_tools_with_the_servers_schema(lab_http):
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        fp.add_turn(s.tool_call(0, id="call_1", name="measure", arguments=json.dumps({"text": "one two"})))
        fp.add_turn(s.text("Two words."))
        tools = lab.tools(include={"measure"}, eager={"measure"})
        with engine_for(fp, tools) as engine:
            result = engine.complete(Q)
    sent = fp.requests[0].json["tools"][0]["function"]
    assert sent["parameters"] == tools[0].spec.parameters
    assert json.loads(result.tool_results[0].text) == {"chars": 7, "words": 2}


@pytest.mark.parametrize("name, text, trust, reason", [
    ("plain", "WRITE", False, "server annotations not trusted (trust_annotations=False)"),
    ("plain", "WRITE", True, "server annotations trusted: not marked readOnlyHint: true"),
    # readOnlyHint and destructiveHint at once: taken at its more dangerous word.
    ("wipe", "wiped write", True, "server annotations trusted: destructiveHint: true"),
])
def test_a_tool_that_may_write_waits_for_the_stream_and_approve(name, text, trust, reason, lab_http, record):
    asked = []
    ended = s.Stamp()
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        fp.add_turn(s.text(block(name, {"text": "write"})), s.text(" and more"), s.signal(ended))
        fp.add_turn(s.text("ok"))

        def approve(call):
            asked.append(call.name)
            return True

        tools = lab.tools(trust_annotations=trust, include={name})
        assert tools[0].side_effects and tools[0].side_effects_reason == reason
        with engine_for(fp, tools, approve=approve) as engine:
            result = engine.complete(Q)
    assert asked == [name] and result.tool_results[0].text == text
    assert record.when(name, "write") is not None
    assert result.tool_results[0].started_at >= ended.at  # gated until the stream had ended


def test_three_mcp_calls_in_one_round_run_at_once(lab_http, record):
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        fp.add_turn(s.text("".join(block("slow", {"seconds": 2, "tag": f"p{i}"}) for i in range(3))))
        fp.add_turn(s.text("ok"))
        with engine_for(fp, lab.tools(trust_annotations=True)) as engine:
            result = engine.complete(Q)
    assert [r.ok for r in result.tool_results] == [True] * 3
    starts = [record.when("start", f"p{i}") for i in range(3)]
    ends = [record.when("end", f"p{i}") for i in range(3)]
    assert max(starts) < min(ends)


def test_the_engines_tool_timeout_cancels_the_servers_handler(lab_http, record):
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        fp.add_turn(s.text(block("slow", {"seconds": 30, "tag": "late"})))
        fp.add_turn(s.text("gave up"))
        with engine_for(fp, lab.tools(trust_annotations=True), tool_timeout=1.0) as engine:
            result = engine.complete(Q)
    failed = result.tool_results[0]
    assert not failed.ok and "timed out after 1s" in failed.error
    assert record.wait("cancelled", "late"), record.events()
    assert "timed out after 1s" in fp.requests[1].json["messages"][-1]["content"]


def test_a_crash_mid_call_is_an_error_result_and_the_run_goes_on(record):
    with McpServer.stdio(*lab_stdio_args(record), name="lab") as lab, FakeProvider() as fp:
        fp.add_turn(s.text(block("exit_now", {"code": 7})))
        fp.add_turn(s.text(block("slow", {"seconds": 0.01, "tag": "after"})))
        fp.add_turn(s.text("recovered"))
        with engine_for(fp, lab.tools(trust_annotations=True)) as engine:
            result = engine.complete(Q)
    crashed, after = result.tool_results
    assert not crashed.ok and "exit status 7" in crashed.error and "'lab'" in crashed.error
    assert after.ok and result.answer == "recovered"


def test_mcp_tools_beside_python_tools_and_results_filed_in_the_rag_store():
    @tool
    def shout(word: str) -> str:
        """Upper-case a word."""
        return word.upper()

    with McpServer.stdio(server_command("mcp-server-time"), "--local-timezone", "UTC") as clock, \
            FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.text(block("get_current_time", {"timezone": "Asia/Tokyo"}) + block("shout", {"word": "hi"})))
        fp.add_turn(s.text(block("rag_search", {"query": "Asia/Tokyo timezone"})))
        fp.add_turn(s.text("ok"))
        with engine_for(fp, [*clock.tools(trust_annotations=True), shout], rag=store) as engine:
            events = list(engine.run(Q))
    results = [e.result for e in events if isinstance(e, ToolResultEvent)]
    assert {r.name for r in results} == {"get_current_time", "shout", "rag_search"}
    assert all(r.ok for r in results), [r.error for r in results]
    assert "Asia/Tokyo" in next(r for r in results if r.name == "rag_search").text


def test_the_readme_example_calls_the_time_server():
    import re
    from pathlib import Path

    from streamengine import EngineConfig as Config
    from streamengine import OpenAICompatibleClient as Client

    readme = (Path(__file__).resolve().parents[2] / "README.rst").read_text(encoding="utf-8")
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", readme)
    (code,) = ["\n".join(line[3:] for line in b.splitlines()) for b in blocks if "streamengine.mcp" in b]

    @tool
    def weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("get_current_time", {"timezone": "Europe/Paris"})))
        fp.add_turn(s.text("It is evening in Paris."))
        client = Client(fp.base_url)
        namespace = {"client": client, "weather": weather, "EngineConfig": Config, "StreamingEngine": StreamingEngine}
        try:
            exec(compile(code, "README.rst", "exec"), namespace)
        finally:
            client.close()
    assert json.loads(namespace["times"][0])["timezone"] == "Europe/Paris"
    assert namespace["reply"].answer == "It is evening in Paris."


def test_closing_the_run_cancels_the_mcp_request_on_the_server(lab_http, record):
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        fp.add_turn(s.text(block("slow", {"seconds": 30, "tag": "abandoned"})), s.forever(s.comment()))
        with engine_for(fp, lab.tools(trust_annotations=True)) as engine:
            run = engine.run(Q)
            for event in run:
                if isinstance(event, ToolStartEvent):
                    break
            assert record.wait("start", "abandoned")
            run.close()  # the caller walks away mid-stream
        assert record.wait("cancelled", "abandoned"), record.events()


def test_an_mcp_call_is_a_client_span_under_its_tool_span_and_carries_traceparent(lab_http):
    """OpenTelemetry: ``tools/call {tool}`` nests under ``execute_tool``; the server gets ``traceparent``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with McpServer.http(lab_http.url) as lab, FakeProvider() as fp:
        fp.add_turn(s.text('<tool name="traced">{}</tool>'))
        fp.add_turn(s.text("done"))
        engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), lab.tools(include=["traced"], eager=True),
                                 EngineConfig(models=["m"], tool_mode="inline"), tracer_provider=provider)
        with engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    spans = {span.name: span for span in exporter.get_finished_spans()}
    tool_span, client_span = spans["execute_tool traced"], spans["tools/call traced"]
    assert client_span.kind is SpanKind.CLIENT
    assert client_span.parent.span_id == tool_span.context.span_id
    assert client_span.attributes["mcp.method.name"] == "tools/call"
    meta = json.loads(result.tool_results[0].text)
    trace_id = format(client_span.context.trace_id, "032x")
    span_id = format(client_span.context.span_id, "016x")
    assert meta["traceparent"].startswith(f"00-{trace_id}-{span_id}-")  # the flags: sampled (and random id)


def test_a_run_with_an_mcp_call_leaves_nothing_for_the_garbage_collector():
    """A call handed over (MCP, process pool, Dask) dies with its run: a done future keeps its callbacks,
    and the handle's give-up hook held the future back, a cycle only the collector freed."""
    from gc_support import left_for_the_collector

    with McpServer.stdio("mcp-server-time", "--local-timezone", "UTC") as clock, FakeProvider() as fp:
        for _ in range(2):  # a warm run, then the one looked at
            fp.add_turn(s.text(block("get_current_time", {"timezone": "Europe/Paris"})))
            fp.add_turn(s.text("It is evening in Paris."))
        with engine_for(fp, clock.tools(trust_annotations=True)) as engine:
            assert isinstance(list(engine.run(Q))[-1], DoneEvent)
            ours = left_for_the_collector(lambda: list(engine.run(Q)))
    assert ours == []
