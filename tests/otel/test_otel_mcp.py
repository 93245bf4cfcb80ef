"""The MCP client span (``tools/call {tool}``) is guarded too, and keeps a tool's error text out without capture.

A real MCP server over HTTP on 127.0.0.1 (tests/support/mcp_servers/lab.py), a
FakeProvider, and the OpenTelemetry SDK's TracerProvider.
"""
from __future__ import annotations

import json
import sys
from typing import Any, List

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from loguru import logger
from mcp_servers.support import lab_http, no_mcp_leak, record  # noqa: F401 - fixtures
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, enable_logging
from streamengine.mcp import McpServer
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")


class RaisingOnMcpSpans(SpanProcessor):
    def __init__(self, hook: str) -> None:
        self.hook, self.raised = hook, 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.hook == "start" and span.name.startswith("tools/call"):
            self.raised += 1
            raise RuntimeError("processor broke on an MCP span")

    def on_end(self, span: Any) -> None:
        if self.hook == "end" and span.name.startswith("tools/call"):
            self.raised += 1
            raise RuntimeError("processor broke on an MCP span")


def call_once(url: str, tool_name: str, arguments: dict, provider: TracerProvider, **engine_options: Any) -> Any:
    with McpServer.http(url) as lab, FakeProvider() as fp:
        fp.add_turn(s.text(f'<tool name="{tool_name}">{json.dumps(arguments)}</tool>'))
        fp.add_turn(s.text("done"))
        engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), lab.tools(include=[tool_name], eager=True),
                                 EngineConfig(models=["m"], tool_mode="inline"), tracer_provider=provider,
                                 **engine_options)
        with engine:
            return engine.complete([{"role": "user", "content": "q"}])


def traced_provider(*processors: SpanProcessor) -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider, exporter


@pytest.mark.parametrize("hook", ["start", "end"])
def test_a_processor_raising_on_the_mcp_client_span_costs_the_call_nothing(lab_http, hook):
    processor = RaisingOnMcpSpans(hook)
    provider, exporter = traced_provider(processor)
    lines: List[str] = []
    handler = enable_logging(level="WARNING", sink=lines.append)
    try:
        result = call_once(lab_http.url, "traced", {}, provider)
    finally:
        logger.remove(handler)
        logger.disable("streamengine")
    (told,) = result.tool_results
    assert told.ok and result.answer == "done"
    assert processor.raised == 1
    assert "execute_tool traced" in {span.name for span in exporter.get_finished_spans()}
    (warning,) = [line for line in lines if "OpenTelemetry" in line]
    assert "MCP client span" in warning


@pytest.mark.parametrize("capture", [False, True])
def test_an_mcp_tools_error_text_reaches_its_client_span_only_with_content_capture(lab_http, capture):
    provider, exporter = traced_provider()
    result = call_once(lab_http.url, "boom", {"reason": "pin 4711"}, provider, capture_content=capture)
    assert not result.tool_results[0].ok
    (span,) = [span for span in exporter.get_finished_spans() if span.name == "tools/call boom"]
    assert span.status.status_code is StatusCode.ERROR
    if capture:
        assert "pin 4711" in span.status.description
    else:
        assert span.status.description == span.attributes["error.type"]
