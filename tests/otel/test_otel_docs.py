"""docs/observability.md's examples run: to the console, and over OTLP to a collector started here.

Each example runs in its own interpreter (it sets process-wide providers)
against a FakeProvider on 127.0.0.1; the collector is a small HTTP server
that decodes what the OTLP exporter posts with the protobuf messages of
``opentelemetry-proto``.
"""
from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def examples() -> List[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


class Collector(http.server.ThreadingHTTPServer):
    """Receives OTLP/HTTP protobuf posts: span names and metric names, as they arrive."""

    def __init__(self) -> None:
        self.spans: List[str] = []
        self.metrics: List[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: Collector = self.server  # type: ignore[assignment]
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            server.spans += [span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
        elif self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            server.metrics += [m.name for rm in request.resource_metrics for sm in rm.scope_metrics
                               for m in sm.metrics]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _run(code: str, fp: FakeProvider, extra: Dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENAI_BASE_URL": fp.base_url, "OPENAI_API_KEY": "sk-docs", "STREAMENGINE_MODEL": "m",
           **extra}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_doc_has_the_console_and_the_otlp_example():
    assert len(examples()) == 2


def test_the_console_example_prints_the_runs_spans():
    with FakeProvider() as fp:
        fp.add_turn(s.text('<tool name="weather">{"city": "Oslo"}</tool>'))
        fp.add_turn(s.text("Sunny in Oslo."))
        done = _run(examples()[0], fp, {})
    assert done.returncode == 0, done.stderr
    assert "Sunny in Oslo." in done.stdout
    for name in ('"name": "invoke_agent weather-bot"', '"name": "chat m"', '"name": "execute_tool weather"'):
        assert name in done.stdout


def test_the_otlp_example_delivers_spans_and_metrics_to_a_collector():
    collector = Collector()
    thread = threading.Thread(target=collector.serve_forever, name="test-otlp-collector")
    thread.start()
    try:
        with FakeProvider() as fp:
            fp.add_turn(s.text("hello there"))
            done = _run(examples()[1], fp, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint})
    finally:
        collector.shutdown()
        collector.server_close()
        thread.join(5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hello there"
    assert sorted(collector.spans) == ["chat m", "invoke_agent streamengine"]
    assert {"gen_ai.client.operation.duration", "gen_ai.invoke_agent.duration"} <= set(collector.metrics)
