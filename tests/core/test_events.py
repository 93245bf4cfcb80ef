"""Events: the chunk event, the emitter's contract (``engine.emitter``), observers, and the engine events' shape."""
from __future__ import annotations

import dataclasses
import typing

import pytest
from loguru import logger

from streamengine import (
    Chunk,
    ConfigError,
    DoneEvent,
    EngineConfig,
    ErrorEvent,
    Event,
    HeartbeatEvent,
    ModelChunkEvent,
    Observer,
    ReasoningEvent,
    RefusalEvent,
    ResetEvent,
    Response,
    RoundEvent,
    ScriptedClient,
    StreamingEngine,
    TokenEvent,
    ToolCall,
    ToolResultEvent,
    ToolStartEvent,
)


@pytest.fixture
def warnings():
    records = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: records.append(m.record["message"]), level="WARNING",
                         filter=lambda r: r["name"].startswith("streamengine"))
    yield records
    logger.remove(handler)
    logger.disable("streamengine")


@pytest.fixture
def emitter():
    """The engine's emitter, the one users subscribe to for every chunk read from the model."""
    with StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(models=["m"])) as engine:
        yield engine.emitter


def test_model_chunk_event_defaults_to_not_final_without_response():
    event = ModelChunkEvent(Chunk(content="x"))
    assert event.is_final is False and event.response is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.is_final = True  # type: ignore[misc]


def test_emitter_delivers_in_subscription_order_until_unsubscribed(emitter):
    seen = []
    emitter.subscribe(lambda e: seen.append(("a", e)))
    unsubscribe_b = emitter.subscribe(lambda e: seen.append(("b", e)))
    emitter.emit(1)
    unsubscribe_b()
    unsubscribe_b()  # twice is harmless
    emitter.emit(2)
    assert seen == [("a", 1), ("b", 1), ("a", 2)]


def test_emitter_is_falsy_without_subscribers_so_hot_paths_can_skip_it(emitter):
    assert not emitter and len(emitter) == 0 and emitter.subscribers == ()
    callback = lambda e: None  # noqa: E731
    unsubscribe = emitter.subscribe(callback)
    assert emitter and emitter.subscriber_count == 1 and emitter.subscribers == (callback,)
    unsubscribe()
    assert not emitter and emitter.subscribers == ()


def test_a_subscriber_may_unsubscribe_itself_while_called(emitter):
    seen = []
    holder = {}

    def once(event):
        seen.append(event)
        holder["unsubscribe"]()

    holder["unsubscribe"] = emitter.subscribe(once)
    emitter.subscribe(lambda e: seen.append(("other", e)))
    emitter.emit("x")
    emitter.emit("y")
    assert seen == ["x", ("other", "x"), ("other", "y")]


def test_a_failing_subscriber_is_logged_and_the_others_still_hear(emitter, warnings):
    seen = []

    def broken(event):
        raise RuntimeError("boom")

    emitter.subscribe(broken)
    emitter.subscribe(seen.append)
    emitter.emit("e")
    assert seen == ["e"]
    assert any("raised on str" in message for message in warnings)


def test_subscribe_rejects_non_callables(emitter):
    with pytest.raises(ConfigError, match="callable"):
        emitter.subscribe("not a function")  # type: ignore[arg-type]


def test_the_engine_hands_every_chunk_to_its_subscribers_the_last_with_the_response():
    with StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(models=["m"])) as engine:
        seen = []
        engine.emitter.subscribe(seen.append)
        assert engine.complete([{"role": "user", "content": "q"}]).answer == "hi"
    assert all(isinstance(event, ModelChunkEvent) for event in seen) and seen[-1].is_final
    assert seen[-1].response.content == "hi" and not any(event.is_final for event in seen[:-1])


def test_observers_are_checked_and_a_failing_one_does_not_stop_the_rest(warnings):
    class Good:
        def __init__(self):
            self.responses = []

        def on_llm_responded(self, response):
            self.responses.append(response)

    class Broken:
        def on_llm_responded(self, response):
            raise RuntimeError("observer bug")

    good = Good()
    assert isinstance(good, Observer)
    with StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(models=["m"]),
                         observers=[Broken(), good]) as engine:
        assert engine.complete([{"role": "user", "content": "q"}]).answer == "hi"
    assert [response.content for response in good.responses] == ["hi"]
    assert isinstance(good.responses[0], Response)
    assert any("on_llm_responded" in message for message in warnings)
    with pytest.raises(ConfigError, match="on_llm_responded"):
        StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(models=["m"]), observers=[object()])


@pytest.mark.parametrize("cls, name, args", [
    (TokenEvent, "token", ("hi",)),
    (ToolStartEvent, "tool_start", (ToolCall("c1", "search", "{}"),)),
    (ToolResultEvent, "tool_result", (object(), "duplicate", ToolCall("c1", "search", "{}"))),
    (RoundEvent, "round", (2,)),
    (ErrorEvent, "error", ("boom", True)),
    (ResetEvent, "reset", (2, "model a failed mid-answer")),
    (DoneEvent, "done", (object(),)),
    (HeartbeatEvent, "heartbeat", ()),
    (RefusalEvent, "refusal", ("I can't help with that", 1)),
    (ReasoningEvent, "reasoning", ("Let me think", 1)),
])
def test_engine_events_are_frozen_and_name_is_a_literal_class_attribute(cls, name, args):
    event = cls(*args)
    assert event.name == name == cls.name
    assert "name" not in {f.name for f in dataclasses.fields(cls)}
    # The Literal lets `if event.name == "token": event.text` narrow the Event union (tests/test_types.py).
    declared = eval(cls.__annotations__["name"], {"ClassVar": typing.ClassVar, "Literal": typing.Literal})
    assert declared == typing.ClassVar[typing.Literal[name]]
    assert len(dataclasses.fields(cls)) == len(args)
    assert cls in typing.get_args(Event)
    if dataclasses.fields(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(event, dataclasses.fields(cls)[0].name, None)


def test_event_union_is_exactly_the_engine_events():
    assert set(typing.get_args(Event)) == {
        TokenEvent, ReasoningEvent, ToolStartEvent, ToolResultEvent, RoundEvent, RefusalEvent, ResetEvent, ErrorEvent,
        DoneEvent, HeartbeatEvent}
