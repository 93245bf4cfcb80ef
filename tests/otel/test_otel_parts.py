"""Images, audio and files in a captured prompt: their kind, type and size, never their bytes or URL."""
from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from parts_support import PDF, PDF_URL, PNG, PNG_URL, WAV, b64

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

SIGNED = "https://images.example/heron.jpg?X-Amz-Signature=secret-signature"


def test_captured_content_names_each_part_without_its_data():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    parts = [{"type": "text", "text": "What is in these?"},
             {"type": "image_url", "image_url": {"url": PNG_URL}},
             {"type": "image_url", "image_url": {"url": SIGNED}},
             {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
             {"type": "file", "file": {"file_data": PDF_URL, "filename": "notes.pdf"}}]
    with FakeProvider() as fp:
        fp.add_turn(s.text("A heron."))
        client = OpenAICompatibleClient(fp.base_url)
        with StreamingEngine(client, [], EngineConfig(models=["m"]), tracer_provider=provider,
                             capture_content=True) as engine:
            engine.complete([{"role": "user", "content": parts}])
        assert fp.requests[0].parts == parts[1:]  # the provider got everything
    (chat,) = [span for span in spans.get_finished_spans() if span.name.startswith("chat ")]
    captured = chat.attributes["gen_ai.input.messages"]
    assert json.loads(captured) == [{"role": "user", "parts": [
        {"type": "text", "content": "What is in these?"},
        {"type": "image", "mime_type": "image/png", "size": len(PNG)},
        {"type": "image", "mime_type": "image/jpeg"},
        {"type": "audio", "mime_type": "audio/wav", "size": len(WAV)},
        {"type": "file", "mime_type": "application/pdf", "size": len(PDF)}]}]
    for secret in (b64(PNG)[:16], b64(WAV)[:16], b64(PDF)[:16], "secret-signature", "images.example"):
        assert all(secret not in str(value) for span in spans.get_finished_spans()
                   for value in span.attributes.values())
