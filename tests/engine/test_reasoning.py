"""Reasoning over real HTTP on every wire: ``reasoning`` events as it streams, kept per round, never in the answer.

Each wire's FakeProvider thinks, calls a tool, then answers; the test reads
the events ``run()`` yields, the ``EngineResult`` and the second request the
provider recorded: what the provider needs back (Anthropic's signed and
redacted thinking blocks, the Responses API's reasoning items) goes back
verbatim, and the reasoning text never does.
"""
from __future__ import annotations

import json

import pytest

from streamengine import (
    AnthropicClient,
    DoneEvent,
    EngineConfig,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    ReasoningEvent,
    StreamingEngine,
    TokenEvent,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

#: (FakeProvider wire, our client, the field a Chat Completions delta carries the reasoning in)
WIRES = {
    "chat-reasoning_content": ("openai", OpenAICompatibleClient, "reasoning_content"),
    "chat-reasoning": ("openai", OpenAICompatibleClient, "reasoning"),
    "anthropic": ("anthropic", AnthropicClient, "reasoning_content"),
    "responses": ("responses", OpenAIResponsesClient, "reasoning_content"),
}
SIGNATURE = "ZmFrZS1zaWduYXR1cmU="  # what FakeProvider's Anthropic wire signs each thinking block with


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def engine_on(fp: FakeProvider, client_class, **config):
    config.setdefault("models", ["thinker"])
    config.setdefault("idle_timeout", 5.0)
    config.setdefault("tool_mode", "native")
    return StreamingEngine(client_class(fp.base_url, api_key="sk-test"), [weather], EngineConfig(**config))


def script(fp: FakeProvider, field: str) -> None:
    fp.add_turn(s.reasoning("The user wants ", field=field), s.reasoning("the weather.", field=field),
                s.redacted_reasoning("EncryptedBlob=="),
                s.tool_call(0, id="call_1", name="weather", arguments='{"city": "Oslo"}'))
    fp.add_turn(s.reasoning("Now I can answer.", field=field), s.text("It is sunny in Oslo."))


@pytest.mark.parametrize("variant", list(WIRES))
def test_reasoning_streams_as_events_and_is_kept_per_round_apart_from_the_answer(variant):
    wire, client_class, field = WIRES[variant]
    with FakeProvider(wire=wire) as fp:
        script(fp, field)
        with engine_on(fp, client_class) as engine:
            events = list(engine.run([{"role": "user", "content": "Weather in Oslo?"}]))
    thoughts = [(e.text, e.round) for e in events if isinstance(e, ReasoningEvent)]
    assert thoughts == [("The user wants ", 1), ("the weather.", 1), ("Now I can answer.", 2)]
    names = [e.name for e in events]
    assert names.index("reasoning") < names.index("tool_start")
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "It is sunny in Oslo."
    result = events[-1].result
    assert isinstance(events[-1], DoneEvent)
    assert result.answer == "It is sunny in Oslo."
    assert result.reasoning == "Now I can answer."
    assert result.reasoning_rounds == ("The user wants the weather.", "Now I can answer.")
    assert "the weather" not in json.dumps(result.rounds)


def test_chat_completions_never_sends_reasoning_back():
    with FakeProvider() as fp:
        script(fp, "reasoning_content")
        with engine_on(fp, OpenAICompatibleClient) as engine:
            engine.complete([{"role": "user", "content": "Weather in Oslo?"}])
        assistant = [m for m in fp.requests[1].json["messages"] if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}]
    assert "reasoning" not in json.dumps(fp.requests[1].json)


def test_anthropic_gets_its_signed_and_redacted_thinking_back_first_in_the_assistant_turn():
    with FakeProvider(wire="anthropic") as fp:
        script(fp, "reasoning_content")
        with engine_on(fp, AnthropicClient) as engine:
            result = engine.complete([{"role": "user", "content": "Weather in Oslo?"}])
        turns = fp.requests[1].json["messages"]
    assert result.answer == "It is sunny in Oslo."
    assert turns[1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants the weather.", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "EncryptedBlob=="},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}}]}
    assert turns[2]["content"][0]["type"] == "tool_result"


@pytest.mark.parametrize("include", [False, True])
def test_responses_gets_its_reasoning_items_back_before_the_calls(include):
    options = {"include": ["reasoning.encrypted_content"], "store": False} if include else None
    with FakeProvider(wire="responses") as fp:
        script(fp, "reasoning_content")
        with engine_on(fp, OpenAIResponsesClient, options=options) as engine:
            engine.complete([{"role": "user", "content": "Weather in Oslo?"}])
        items = fp.requests[1].json["input"]
    kinds = [item["type"] for item in items]
    assert kinds == ["message", "reasoning", "reasoning", "function_call", "function_call_output"]
    summary = {"id": "rs_fake_0", "type": "reasoning",
               "summary": [{"type": "summary_text", "text": "The user wants the weather."}]}
    if include:
        summary["encrypted_content"] = items[1]["encrypted_content"]
        assert items[1]["encrypted_content"].startswith("gAAAAA")
    assert items[1] == summary
    assert items[2] == {"id": "rs_fake_1", "type": "reasoning", "summary": [], "encrypted_content": "EncryptedBlob=="}
    assert items[3]["call_id"] == "call_1"


@pytest.mark.parametrize("wire, client_class", [("anthropic", AnthropicClient),
                                                 ("responses", OpenAIResponsesClient)])
def test_what_goes_back_counts_against_max_reasoning_chars(wire, client_class):
    with FakeProvider(wire=wire) as fp:
        fp.add_turn(s.reasoning("short"), s.redacted_reasoning("x" * 500),
                    s.tool_call(0, id="call_1", name="weather", arguments='{"city": "Oslo"}'))
        with engine_on(fp, client_class, max_reasoning_chars=200) as engine:
            result = list(engine.run([{"role": "user", "content": "Weather in Oslo?"}]))[-1].result
    assert result.telemetry.stop_reason == "output_limit"
    assert "reasoning items" in result.error and "max_reasoning_chars" in result.error
    assert result.telemetry.tools_started == 0


def test_a_model_that_fails_while_thinking_has_its_reasoning_reset_before_the_next_one_thinks():
    with FakeProvider() as fp:
        fp.respond_with(lambda request: [s.reasoning("doomed thought"), s.delay(0.05), s.drop()]
                        if request["model"] == "flaky" else [s.reasoning("good thought"), s.text("Answer.")])
        with engine_on(fp, OpenAICompatibleClient, models=["flaky", "steady"], max_retries=0) as engine:
            events = list(engine.run([{"role": "user", "content": "q"}]))
    names = [e.name for e in events if e.name in ("reasoning", "reset", "token")]
    assert names == ["reasoning", "reset", "reasoning", "token"]
    reset = next(e for e in events if e.name == "reset")
    assert reset.round == 1 and "flaky failed while thinking" in reset.reason
    result = events[-1].result
    assert result.reasoning == "good thought" and result.answer == "Answer."
    assert result.telemetry.model_used == "steady"


def test_with_store_false_a_reasoning_item_goes_back_only_with_its_encrypted_content():
    with FakeProvider(wire="responses") as fp:
        script(fp, "reasoning_content")
        with engine_on(fp, OpenAIResponsesClient, options={"store": False}) as engine:
            assert engine.complete([{"role": "user", "content": "Weather in Oslo?"}]).answer == "It is sunny in Oslo."
        items = fp.requests[1].json["input"]
    # OpenAI kept nothing to find the summary's item by id; the redacted one carries its encrypted_content.
    assert [item["type"] for item in items] == ["message", "reasoning", "function_call", "function_call_output"]
    assert items[1]["encrypted_content"] == "EncryptedBlob=="
