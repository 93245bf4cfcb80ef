"""A run whose question holds an image: tools, caps and filing work on text, and the image stays in every round.

Over real HTTP on each wire (FakeProvider), with a real SqliteRagStore.
"""
from __future__ import annotations

import json

import pytest
from parts_support import PNG, PNG_URL, b64

from streamengine import (
    AnthropicClient,
    EngineConfig,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    SqliteRagStore,
    StreamingEngine,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

CLIENTS = {"openai": OpenAICompatibleClient, "anthropic": AnthropicClient, "responses": OpenAIResponsesClient}
IMAGE = {"type": "image_url", "image_url": {"url": PNG_URL}}
QUESTION = [{"type": "text", "text": "Which bird is this, and where does it nest?"}, IMAGE]
#: The image as each wire carries it.
CARRIED = {"openai": IMAGE,
           "anthropic": {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
           "responses": {"type": "input_image", "image_url": PNG_URL, "detail": "auto"}}


@tool
def field_guide(bird: str) -> str:
    """Look a bird up in the field guide."""
    return f"The {bird} nests in colonies beside quartzite cliffs."


def block(name, args):
    return f'<tool name="{name}">{json.dumps(args)}</tool>'


@pytest.mark.parametrize("wire", sorted(CLIENTS))
def test_inline_tools_and_filing_work_on_the_text_and_every_round_sends_the_image(wire):
    with FakeProvider(wire=wire) as fp, SqliteRagStore() as store, \
            CLIENTS[wire](fp.base_url, api_key="sk-parts") as client:
        fp.add_turn(s.text("A grey heron. " + block("field_guide", {"bird": "grey heron"})))
        fp.add_turn(s.text("A grey heron; it nests by quartzite cliffs."))
        config = EngineConfig(models=["m"], tool_mode="inline")
        with StreamingEngine(client, [field_guide], config, rag=store) as engine:
            result = engine.complete([{"role": "user", "content": QUESTION}], conversation_id="birds")
            hits = store.search("quartzite cliffs", k=1, scope="conversation:birds")
        first, second = fp.requests
    assert [r.text for r in result.tool_results] == ["The grey heron nests in colonies beside quartzite cliffs."]
    assert result.answer == "A grey heron; it nests by quartzite cliffs."
    assert first.parts == second.parts == [CARRIED[wire]]
    assert hits and "quartzite" in hits[0].text


def test_the_output_caps_count_the_answer_not_the_image():
    with FakeProvider() as fp:
        fp.add_turn(s.text("A heron. " * 10))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [],
                             EngineConfig(models=["m"], max_answer_chars=40)) as engine:
            result = engine.complete([{"role": "user", "content": QUESTION}], raise_on_error=False)
    assert len(PNG_URL) > 40  # the question alone is over the cap: it does not count
    assert result.telemetry.stop_reason == "output_limit"
    assert fp.requests[0].parts == [IMAGE]
