"""Events: the chunk event, the emitter's contract, and the engine events' shape."""
from __future__ import annotations

import dataclasses
import typing

import pytest
from loguru import logger

from streamengine._calls.hooks import EventEmitter, ModelChunkEvent, Observer, check_observers, notify_observers
from streamengine._engine.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    HeartbeatEvent,
    RefusalEvent,
    ResetEvent,
    RoundEvent,
    TokenEvent,
    ToolResultEvent,
    ToolStartEvent,
)
from streamengine._errors import ConfigError
from streamengine._messages import Chunk, Response, ToolCall


@pytest.fixture
def warnings():
    records = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: records.append(m.record["message"]), level="WARNING",
                         filter=lambda r: r["name"].startswith("streamengine"))
    yield records
    logger.remove(handler)
    logger.disable("streamengine")


def test_model_chunk_event_defaults_to_not_final_without_response():
    event = ModelChunkEvent(Chunk(content="x"))
    assert event.is_final is False and event.response is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.is_final = True  # type: ignore[misc]


def test_emitter_delivers_in_subscription_order_until_unsubscribed():
    emitter = EventEmitter()
    seen = []
    emitter.subscribe(lambda e: seen.append(("a", e)))
    unsubscribe_b = emitter.subscribe(lambda e: seen.append(("b", e)))
    emitter.emit(1)
    unsubscribe_b()
    unsubscribe_b()  # twice is harmless
    emitter.emit(2)
    assert seen == [("a", 1), ("b", 1), ("a", 2)]


def test_emitter_is_falsy_without_subscribers_so_hot_paths_can_skip_it():
    emitter = EventEmitter()
    assert not emitter and len(emitter) == 0 and emitter.subscribers == ()
    callback = lambda e: None  # noqa: E731
    unsubscribe = emitter.subscribe(callback)
    assert emitter and emitter.subscriber_count == 1 and emitter.subscribers == (callback,)
    unsubscribe()
    assert not emitter and emitter.subscribers == ()


def test_a_subscriber_may_unsubscribe_itself_while_called():
    emitter = EventEmitter()
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


def test_a_failing_subscriber_is_logged_and_the_others_still_hear(warnings):
    emitter = EventEmitter()
    seen = []

    def broken(event):
        raise RuntimeError("boom")

    emitter.subscribe(broken)
    emitter.subscribe(seen.append)
    emitter.emit("e")
    assert seen == ["e"]
    assert any("raised on str" in message for message in warnings)


def test_subscribe_rejects_non_callables():
    with pytest.raises(ConfigError, match="callable"):
        EventEmitter().subscribe("not a function")  # type: ignore[arg-type]


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
    observers = check_observers([Broken(), good])
    notify_observers(observers, Response(content="hi"), logger)
    assert good.responses == [Response(content="hi")]
    assert any("on_llm_responded" in message for message in warnings)
    with pytest.raises(ConfigError, match="on_llm_responded"):
        check_observers([object()])


@pytest.mark.parametrize("cls, name, args", [
    (TokenEvent, "token", ("hi",)),
    (ToolStartEvent, "tool_start", (ToolCall("c1", "search", "{}"),)),
    (ToolResultEvent, "tool_result", (object(), "duplicate")),
    (RoundEvent, "round", (2,)),
    (ErrorEvent, "error", ("boom", True)),
    (ResetEvent, "reset", (2, "model a failed mid-answer")),
    (DoneEvent, "done", (object(),)),
    (HeartbeatEvent, "heartbeat", ()),
    (RefusalEvent, "refusal", ("I can't help with that", 1)),
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
        TokenEvent, ToolStartEvent, ToolResultEvent, RoundEvent, RefusalEvent, ResetEvent, ErrorEvent, DoneEvent,
        HeartbeatEvent}
