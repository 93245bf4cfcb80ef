"""Call strategies against the in-process ScriptedClient: timeouts, cancel, events, errors."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for
from loguru import logger

from streamengine import (
    CancelToken,
    Chunk,
    CompletionOptions,
    ConfigError,
    LlmCancelledError,
    LlmClient,
    LlmHttpError,
    LlmStreamError,
    LlmTimeoutError,
    ScriptedClient,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from streamengine._calls.hooks import EventEmitter
from streamengine._calls.strategies import BufferedCallStrategy, StreamingCallStrategy, _Stopped, make_call_strategy
from streamengine._wait import drive

STALL = ScriptedClient.STALL
MESSAGES = [{"role": "user", "content": "hi"}]
GUARD = 5.0  # failure guard only: no test should come near it


# The shared guard from conftest.py: no thread a test starts may outlive it.
pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.fixture
def logs():
    records = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: records.append(m.record), level="DEBUG",
                         filter=lambda r: r["name"].startswith("streamengine"))
    yield records
    logger.remove(handler)
    logger.disable("streamengine")


class Recorder:
    """An observer that counts responses."""

    def __init__(self):
        self.responses = []

    def on_llm_responded(self, response):
        self.responses.append(response)


class BufferedOnly(LlmClient):
    """A client that cannot stream: delegates complete() to a ScriptedClient."""

    def __init__(self, *turns):
        self.scripted = ScriptedClient(turns)

    def complete(self, messages, tools=None, options=None, cancel=None):
        return self.scripted.complete(messages, tools, options, cancel)


def streaming(*turns, idle=0.3, cap=GUARD, **kwargs):
    client = ScriptedClient(turns)
    return client, StreamingCallStrategy(client, idle_timeout=idle, completion_timeout=cap, **kwargs)


# --------------------------------------------------------------------------- factory & config

def test_make_call_strategy_picks_by_capability():
    assert isinstance(make_call_strategy(ScriptedClient()), StreamingCallStrategy)
    buffered = make_call_strategy(BufferedOnly(), completion_timeout=7)
    assert isinstance(buffered, BufferedCallStrategy) and buffered.completion_timeout == 7.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5", None])
@pytest.mark.parametrize("name", ["idle_timeout", "completion_timeout"])
def test_timeouts_must_be_positive_finite_numbers(name, bad):
    for client in (ScriptedClient(), BufferedOnly()):
        with pytest.raises(ConfigError, match=name):
            make_call_strategy(client, **{name: bad})


def test_constructors_reject_wrong_clients_observers_and_emitters():
    with pytest.raises(ConfigError, match="LlmClient"):
        make_call_strategy(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="StreamingLlmClient"):
        StreamingCallStrategy(BufferedOnly())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_llm_responded"):
        make_call_strategy(ScriptedClient(), observers=[object()])
    with pytest.raises(ConfigError, match="emit"):
        make_call_strategy(ScriptedClient(), emitter=object())

    class EmitOnly:  # the per-chunk check reads .subscribers: an emitter without it is refused up front
        def emit(self, event):
            pass
    with pytest.raises(ConfigError, match="subscribers tuple"):
        make_call_strategy(ScriptedClient(), emitter=EmitOnly())


# --------------------------------------------------------------------------- streaming success

def test_stream_returns_the_aggregated_response_and_feeds_every_chunk_in_order():
    chunks = [Chunk(content="Hel"), Chunk(), Chunk(reasoning="hmm"), Chunk(content="lo"),
              Chunk(tool_calls=(ToolCallDelta(0, "c1", "search", '{"q": 1}'),)),
              Chunk(finish_reason="tool_calls"), Chunk(usage=Usage(2, 3, 5))]
    client, strategy = streaming(chunks)
    seen = []
    response = drive(strategy.stream_call(MESSAGES, options=CompletionOptions(model="m"), on_chunk=seen.append))
    assert response.content == "Hello"
    assert response.tool_calls == (ToolCall("c1", "search", '{"q": 1}'),)
    assert response.usage == Usage(2, 3, 5)
    assert response.finish_reason == "tool_calls" and response.model == "m"
    assert seen[:-1] == chunks and seen[-1].is_completed
    assert client.calls[0].options.model == "m" and client.calls[0].streamed


def test_events_one_per_chunk_and_exactly_one_final_with_the_response():
    emitter = EventEmitter()
    events = []
    emitter.subscribe(events.append)
    recorder = Recorder()
    _, strategy = streaming(["a", Chunk(), "b"], emitter=emitter, observers=[recorder])
    response = drive(strategy.stream_call(MESSAGES))
    assert [e.chunk.content for e in events] == ["a", None, "b", None]
    assert [e.is_final for e in events] == [False, False, False, True]
    assert events[-1].response == response and all(e.response is None for e in events[:-1])
    assert recorder.responses == [response]


def test_failed_calls_emit_no_final_event_and_tell_no_observer():
    emitter = EventEmitter()
    events = []
    emitter.subscribe(events.append)
    recorder = Recorder()
    _, strategy = streaming(["a", LlmHttpError(502, "bad gateway")], emitter=emitter, observers=[recorder])
    with pytest.raises(LlmHttpError):
        drive(strategy.stream_call(MESSAGES))
    assert [e.is_final for e in events] == [False]
    assert recorder.responses == []


# --------------------------------------------------------------------------- timeouts

def test_no_meaningful_chunk_within_the_idle_timeout_is_unavailable():
    _client, strategy = streaming([Chunk(), STALL], idle=0.25)
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES))
    err = info.value
    assert str(err) == ("LLM streaming: no response received within 0.25s "
                        "(model may be unavailable or overloaded)")
    assert (err.verb, err.timeout_s, err.chunks_received) == ("unavailable", 0.25, 0)
    assert err.__cause__ is None  # the wait came back at its deadline: no read had to fail


def test_silence_after_meaningful_chunks_is_an_idle_timeout():
    _, strategy = streaming(["a", "b", STALL], idle=0.25)
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES))
    assert str(info.value) == "LLM streaming idle timeout: no meaningful chunk received for 0.25s (after 2 chunks)"
    assert (info.value.verb, info.value.chunks_received) == ("timed out", 2)


def test_keep_alive_chunks_do_not_reset_the_idle_timer():
    # Empty chunks for ~10 s: if they reset the idle timer, the 3 s cap would fire instead.
    keep_alives = [x for _ in range(200) for x in (0.05, Chunk())]
    _, strategy = streaming(["a"] + keep_alives, idle=0.3, cap=3.0)
    seen = []
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES, on_chunk=seen.append))
    assert "idle timeout" in str(info.value) and info.value.chunks_received == 1
    assert len(seen) > 1  # keep-alives did arrive (and reached on_chunk) while the timer ran


def test_the_cap_fires_while_chunks_flow():
    flowing = [x for _ in range(500) for x in ("x", 0.01)]
    _, strategy = streaming(flowing, idle=2.0, cap=0.5)
    seen = []
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES, on_chunk=seen.append))
    err = info.value
    assert str(err) == (f"LLM streaming completion timeout: stream exceeded the 0.5s cap "
                        f"(after {len(seen)} chunks)")
    assert (err.verb, err.timeout_s, err.chunks_received) == ("timed out", 0.5, len(seen))


def test_the_cap_before_any_meaningful_chunk_uses_the_first_message_with_the_cap():
    _, strategy = streaming([STALL], idle=GUARD, cap=0.25)
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES))
    assert str(info.value).startswith("LLM streaming: no response received within 0.25s")
    assert (info.value.verb, info.value.timeout_s) == ("unavailable", 0.25)


@pytest.mark.parametrize("kind, meaningful, expected", [
    (_Stopped.IDLE, 0, "LLM streaming: no response received within 30s (model may be unavailable or overloaded)"),
    (_Stopped.CAP, 0, "LLM streaming: no response received within 60s (model may be unavailable or overloaded)"),
    (_Stopped.IDLE, 12, "LLM streaming idle timeout: no meaningful chunk received for 30s (after 12 chunks)"),
    (_Stopped.CAP, 3, "LLM streaming completion timeout: stream exceeded the 60s cap (after 3 chunks)"),
])
def test_messages_format_whole_seconds_without_a_decimal_point(kind, meaningful, expected):
    strategy = StreamingCallStrategy(ScriptedClient(), idle_timeout=30.0, completion_timeout=60.0)
    err = strategy._stop_error(_Stopped(kind, meaningful, meaningful), None, time.monotonic(), None)
    assert str(err) == expected


def test_timeout_is_logged_as_a_warning_with_duration_chunks_and_transport_error(logs):
    _, strategy = streaming(["a", STALL], idle=0.25)
    with pytest.raises(LlmTimeoutError):
        drive(strategy.stream_call(MESSAGES, options=CompletionOptions(model="gpt-x")))
    warnings = [r for r in logs if r["level"].name == "WARNING"]
    assert len(warnings) == 1
    text = warnings[0]["message"]
    assert text.startswith("LLM streaming idle timeout")
    assert "model gpt-x" in text and "1 meaningful chunks" in text
    assert "after 0." in text  # the duration
    assert "transport: nothing (the read had not failed)" in text  # the wait ended at the deadline
    assert warnings[0]["extra"]["component"] == "streamengine._calls.strategies.StreamingCallStrategy"


# --------------------------------------------------------------------------- failures

def test_a_producer_error_is_re_raised_in_the_caller_as_the_same_object():
    boom = LlmHttpError(503, "overloaded")
    _, strategy = streaming(["partial", boom])
    with pytest.raises(LlmHttpError) as info:
        drive(strategy.stream_call(MESSAGES))
    assert info.value is boom


def test_a_stream_that_just_ends_is_a_failure_without_partial_content():
    client = ScriptedClient([["par", "tial"]], auto_complete=False)
    strategy = StreamingCallStrategy(client, idle_timeout=GUARD, completion_timeout=GUARD)
    with pytest.raises(LlmStreamError, match="ended without a completed chunk after 2 meaningful chunks"):
        drive(strategy.stream_call(MESSAGES))


def test_an_on_chunk_error_cancels_the_stream_and_propagates_as_is():
    _client, strategy = streaming(["a", STALL], idle=GUARD)

    def on_chunk(chunk):
        raise KeyError("engine bug")

    with pytest.raises(KeyError, match="engine bug"):
        drive(strategy.stream_call(MESSAGES, on_chunk=on_chunk))
    # the fixture checks that the producer, stalled until cancelled, has ended


def test_no_turn_left_is_an_http_500_like_fake_provider():
    _, strategy = streaming()
    with pytest.raises(LlmHttpError, match="no scripted turn left") as info:
        drive(strategy.stream_call(MESSAGES))
    assert info.value.status_code == 500


# --------------------------------------------------------------------------- cancel

@pytest.mark.parametrize("make_event", [threading.Event, CancelToken])
def test_cancel_from_another_thread_ends_a_stalled_stream(make_event):
    cancel = make_event()
    got_first = threading.Event()
    _client, strategy = streaming(["a", STALL], idle=GUARD)
    canceller = threading.Thread(target=lambda: got_first.wait(GUARD) and cancel.set())
    canceller.start()
    with pytest.raises(LlmCancelledError, match="cancelled by the caller"):
        # a stall would time out
        drive(strategy.stream_call(MESSAGES, cancel=cancel, on_chunk=lambda c: got_first.set()))
    canceller.join()


def test_cancel_already_set_does_not_call_the_model():
    cancel = threading.Event()
    cancel.set()
    client, strategy = streaming(["never"])
    with pytest.raises(LlmCancelledError):
        drive(strategy.stream_call(MESSAGES, cancel=cancel))
    assert client.calls == [] and client.remaining == 1


def test_cancel_while_chunks_are_queued_stops_feeding_them():
    cancel = CancelToken()
    seen = []

    def on_chunk(chunk):
        seen.append(chunk)
        cancel.set()

    _, strategy = streaming(["a", "b", "c", "d", STALL], idle=GUARD)
    with pytest.raises(LlmCancelledError):
        drive(strategy.stream_call(MESSAGES, cancel=cancel, on_chunk=on_chunk))
    assert [c.content for c in seen] == ["a"]


def test_a_client_that_ignores_cancel_is_left_on_its_worker_and_warned_about(logs, monkeypatch):
    """Its worker is waited for briefly, then left (a daemon); its late chunk is not fed on."""
    from streamengine._clients import base

    monkeypatch.setattr(base, "WORKER_JOIN_S", 0.1)

    class Deaf(ScriptedClient):
        def stream(self, messages, tools=None, options=None, cancel=None):
            yield Chunk(content="a")
            cancel.wait(GUARD)  # notices the cancel only by waiting on it, then carries on regardless
            threading.Event().wait(0.3)  # and answers well after the join timeout (the deafness itself)
            yield Chunk(content="late")

    strategy = StreamingCallStrategy(Deaf(), idle_timeout=0.2, completion_timeout=GUARD)
    seen = []
    started = time.monotonic()
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES, on_chunk=seen.append))
    assert str(info.value).startswith("LLM streaming idle timeout") and info.value.chunks_received == 1
    assert info.value.__cause__ is None  # the client never raised
    assert [c.content for c in seen] == ["a"] and time.monotonic() - started < 0.45  # not held until it answers
    assert any("ignores cancel" in r["message"] for r in logs)
    assert wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("streamengine-stream")], GUARD)


# --------------------------------------------------------------------------- buffered

def test_buffered_hands_one_completed_chunk_and_one_final_event():
    emitter = EventEmitter()
    events = []
    emitter.subscribe(events.append)
    recorder = Recorder()
    client = BufferedOnly(["Hi ", "there", Chunk(tool_calls=(ToolCallDelta(0, "c1", "f", "{}"),)),
                           Chunk(usage=Usage(1, 2, 3))])
    strategy = BufferedCallStrategy(client, completion_timeout=GUARD, emitter=emitter, observers=[recorder])
    seen = []
    response = drive(strategy.stream_call(MESSAGES, on_chunk=seen.append))
    assert response.content == "Hi there" and response.usage == Usage(1, 2, 3)
    assert len(seen) == 1 and seen[0].is_completed
    assert seen[0].content == "Hi there"
    assert seen[0].tool_calls == (ToolCallDelta(0, "c1", "f", "{}"),)
    assert [(e.is_final, e.response) for e in events] == [(True, response)]
    assert recorder.responses == [response]
    assert client.scripted.calls[0].streamed is False


def test_buffered_timeout_message_and_verb():
    strategy = BufferedCallStrategy(BufferedOnly([STALL]), completion_timeout=0.25)
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES))
    assert str(info.value) == ("LLM buffered completion timeout: no response received within 0.25s "
                               "(model may be unavailable or overloaded)")
    assert (info.value.verb, info.value.timeout_s, info.value.chunks_received) == ("unavailable", 0.25, 0)
    assert isinstance(info.value.__cause__, LlmCancelledError)


def test_buffered_errors_and_cancel():
    boom = LlmHttpError(401, "bad key")
    strategy = BufferedCallStrategy(BufferedOnly([boom], [STALL]), completion_timeout=GUARD)
    with pytest.raises(LlmHttpError) as info:
        drive(strategy.stream_call(MESSAGES))
    assert info.value is boom
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    with pytest.raises(LlmCancelledError):
        drive(strategy.stream_call(MESSAGES, cancel=cancel))
