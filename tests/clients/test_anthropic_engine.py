"""The engine, unchanged, on the Anthropic wire; and failover across providers with RoutedClient.

``StreamingEngine(AnthropicClient(fp.base_url), tools, EngineConfig(...))``
against ``FakeProvider(wire="anthropic")``: inline tools, native tools
dispatched at their block's stop (before the stream ends), failover and
cancel.  Then two FakeProviders, one per wire, behind one RoutedClient.
"""
from __future__ import annotations

import threading
import time

import pytest

from streamengine import (
    AnthropicClient,
    CompletionOptions,
    ConfigError,
    DoneEvent,
    EngineConfig,
    OpenAICompatibleClient,
    RoutedClient,
    StreamingEngine,
    TokenEvent,
    ToolStartEvent,
)
from streamengine.testing import FakeProvider, Stamp
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def make_engine(client, tools=(), **config):
    config.setdefault("models", ["claude-main"])
    config.setdefault("idle_timeout", 5.0)
    config.setdefault("completion_timeout", 10.0)
    return StreamingEngine(client, tools, EngineConfig(**config))


def run(engine, prompt="question", **kw):
    events = list(engine.run([{"role": "user", "content": prompt}], **kw))
    assert isinstance(events[-1], DoneEvent), [e.name for e in events]
    return events, events[-1].result


def test_an_inline_tool_runs_while_the_model_talks_and_its_result_feeds_the_next_round():
    started = threading.Event()

    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        started.set()
        return f"sunny in {city}"

    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.text("Checking. "), s.text('<tool name="lookup">{"city": "Oslo"}</tool>'),
                    s.wait(started, timeout=5), s.text(" still talking"))
        fp.add_turn(s.text("It is sunny in Oslo."))
        with make_engine(AnthropicClient(fp.base_url), [lookup], tool_mode="inline") as engine:
            events, result = run(engine)
    assert started.is_set() and result.answer == "It is sunny in Oslo."
    order = [e.name for e in events]
    later = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent) and "still talking" in e.text)
    assert order.index("tool_start") < later
    first, second = (r.json for r in fp.requests)
    assert "<tool name=" in first["system"] and all(m["role"] != "system" for m in first["messages"])
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert "sunny in Oslo" in second["messages"][-1]["content"][0]["text"]


def test_native_tool_calls_start_at_their_block_stop_and_come_back_as_tool_results():
    first_started, second_started, released = threading.Event(), threading.Event(), Stamp()
    second_at = []

    @tool
    def first(q: str) -> str:
        """First."""
        first_started.set()
        return "one"

    @tool
    def second(q: str) -> str:
        """Second."""
        second_at.append(time.monotonic())
        second_started.set()
        return "two"

    with FakeProvider(wire="anthropic") as fp:
        # The stream goes on only once both tools run: the last one (no higher index follows it)
        # must start at its block's stop, which "text" brings, not at the end of the message.
        fp.add_turn(s.text("Let me check."),
                    s.tool_call(0, id="toolu_1", name="first", arguments='{"q":'),
                    s.tool_call(0, arguments=' "a"}'),
                    s.tool_call(1, id="toolu_2", name="second", arguments='{"q": "b"}'),
                    s.text(" Done asking."), s.wait(first_started, timeout=5),
                    s.wait(second_started, timeout=5), s.signal(released),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("both done"))
        with make_engine(AnthropicClient(fp.base_url), [first, second], tool_mode="native") as engine:
            events, result = run(engine)
    # A wait that times out goes on, so the proof is the order: the last tool ran before
    # the server got past its wait, i.e. before the stop reason and the end of the stream.
    assert released.at is not None and second_at[0] < released.at
    assert result.answer == "both done"
    assert [r.text for r in result.tool_results] == ["one", "two"]
    assert sorted(e.call.id for e in events if isinstance(e, ToolStartEvent)) == ["toolu_1", "toolu_2"]
    request = fp.requests[0].json
    assert [t["name"] for t in request["tools"]] == ["first", "second"]
    assert all("input_schema" in t for t in request["tools"])
    messages = fp.requests[1].json["messages"]
    assert messages[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check. Done asking."},
        {"type": "tool_use", "id": "toolu_1", "name": "first", "input": {"q": "a"}},
        {"type": "tool_use", "id": "toolu_2", "name": "second", "input": {"q": "b"}}]}
    assert messages[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "one"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "two"}]}


def test_an_overloaded_model_fails_over_before_its_first_token():
    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.error_frame("Overloaded", type="overloaded_error"))
        fp.add_turn(s.text("from the backup"))
        with make_engine(AnthropicClient(fp.base_url), models=["claude-main", "claude-backup"]) as engine:
            _, result = run(engine)
    assert result.answer == "from the backup"
    assert (result.telemetry.model_used, result.telemetry.failovers) == ("claude-backup", 1)
    assert [r.json["model"] for r in fp.requests] == ["claude-main", "claude-backup"]


def test_cancel_mid_stream_stops_the_tool_and_closes_the_connection():
    tool_running, saw_cancel = threading.Event(), threading.Event()

    @tool
    def slow(ctx: ToolContext) -> str:
        """Slow."""
        tool_running.set()
        if ctx.cancel_event.wait(10):
            saw_cancel.set()
        return "x"

    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.tool_call(0, id="toolu_s", name="slow", arguments="{}"), s.text("waiting"), s.stall())
        with make_engine(AnthropicClient(fp.base_url), [slow], tool_mode="native") as engine:
            cancel = threading.Event()
            events = []
            for event in engine.run([{"role": "user", "content": "q"}], cancel=cancel):
                events.append(event)
                if isinstance(event, ToolStartEvent):
                    assert tool_running.wait(5)
                    cancel.set()
            assert saw_cancel.wait(5)
            assert fp.wait_for_client_disconnects(1, 5)
    assert events[-1].result.telemetry.stop_reason == "cancelled"


# --- RoutedClient: one model list across providers ---------------------------------------------------

@pytest.mark.parametrize("failure", [
    s.http_error(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    s.error_frame("Overloaded", type="overloaded_error"),
    s.drop()], ids=["http-529", "in-band-overloaded", "dropped"])
def test_failover_from_anthropic_to_an_openai_provider(failure):
    with FakeProvider(wire="anthropic") as claude, FakeProvider() as local:
        claude.add_turn(failure)
        local.add_turn(s.text("answer from llama"))
        client = RoutedClient({"anthropic": AnthropicClient(claude.base_url, api_key="sk-ant"),
                               "openai": OpenAICompatibleClient(local.base_url, api_key="sk-oai")}, default="openai")
        with make_engine(client, models=["anthropic:claude-x", "openai:llama3"]) as engine:
            _, result = run(engine)
    assert result.answer == "answer from llama"
    assert (result.telemetry.model_used, result.telemetry.failovers) == ("openai:llama3", 1)
    assert [r.json["model"] for r in claude.requests] == ["claude-x"]
    assert [(r.path, r.json["model"]) for r in local.requests] == [("/v1/chat/completions", "llama3")]
    assert claude.requests[0].headers["x-api-key"] == "sk-ant"
    assert local.requests[0].headers["Authorization"] == "Bearer sk-oai"


def test_failover_from_an_openai_provider_to_anthropic_with_unprefixed_default():
    with FakeProvider(wire="anthropic") as claude, FakeProvider() as local:
        local.add_turn(s.http_error(503, {"error": {"message": "loading model"}}))
        claude.add_turn(s.text("answer from claude"), s.usage(prompt=5, completion=3))
        client = RoutedClient({"anthropic": AnthropicClient(claude.base_url),
                               "openai": OpenAICompatibleClient(local.base_url)}, default="openai")
        with make_engine(client, models=["llama3:8b", "anthropic:claude-x"]) as engine:
            _, result = run(engine)
    assert result.answer == "answer from claude"
    assert [r.json["model"] for r in local.requests] == ["llama3:8b"]  # an Ollama tag, not a route
    assert [r.json["model"] for r in claude.requests] == ["claude-x"]


def test_routing_rules_and_configuration_errors():
    anthropic_client, openai_client = AnthropicClient("http://127.0.0.1:9"), OpenAICompatibleClient("http://127.0.0.1:9")
    routed = RoutedClient({"anthropic": anthropic_client, "openai": openai_client}, default="openai")
    assert routed.route("anthropic:claude-x") == (anthropic_client, "claude-x")
    assert routed.route("openai:gpt-4o:latest") == (openai_client, "gpt-4o:latest")
    assert routed.route("gpt-4o") == (openai_client, "gpt-4o")
    with pytest.raises(ConfigError, match="names route 'anthropic' but no model"):
        routed.route("anthropic:")
    strict = RoutedClient({"anthropic": anthropic_client})
    with pytest.raises(ConfigError, match="no route prefix"):
        strict.stream([{"role": "user", "content": "x"}], options=CompletionOptions(model="gpt-4o"))
    with pytest.raises(ConfigError, match="default route 'x'"):
        RoutedClient({"anthropic": anthropic_client}, default="x")
    with pytest.raises(ConfigError, match="without ':'"):
        RoutedClient({"a:b": anthropic_client})
    with pytest.raises(ConfigError, match="StreamingLlmClient"):
        RoutedClient({"a": object()})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="mapping"):
        RoutedClient({})
    routed.close()
    keyed = RoutedClient({"anthropic": AnthropicClient("http://127.0.0.1:9", api_key="sk-ant-hidden")})
    assert "sk-ant-hidden" not in repr(keyed) and "anthropic" in repr(keyed)
    keyed.close()
