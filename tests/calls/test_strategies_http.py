"""Call strategies and failover through real loopback HTTP (FakeProvider + OpenAICompatibleClient).

The in-process tests (test_strategies.py, test_failover.py) pin the logic; these
check it survives a real transport: keep-alive frames that reach the socket
but must not reach the idle timer, sockets shut down on timeout and cancel,
headers such as ``retry-after-ms`` parsed on the way.
"""
from __future__ import annotations

import threading
import time

import pytest
from backoff_support import RecordedBackoffs
from http_support import MESSAGES, provider_fixtures
from loguru import logger

from streamengine import (
    AllModelsFailedError,
    CancelToken,
    CompletionOptions,
    LlmCancelledError,
    LlmClient,
    LlmConnectionError,
    LlmHttpError,
    LlmStreamError,
    LlmTimeoutError,
    OpenAICompatibleClient,
    ToolCall,
    Usage,
)
from streamengine._calls.failover import ModelFailover
from streamengine._calls.hooks import EventEmitter
from streamengine._calls.strategies import BufferedCallStrategy, StreamingCallStrategy, make_call_strategy
from streamengine._wait import drive
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

GUARD = 5.0  # failure guard only


# The shared guard from conftest.py: no thread a test starts may outlive it.
pytestmark = pytest.mark.usefixtures("no_thread_leak")
fp, client = provider_fixtures("openai", api_key="sk-test")


@pytest.fixture
def warnings():
    records = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: records.append(m.record), level="WARNING",
                         filter=lambda r: r["name"].startswith("streamengine"))
    yield records
    logger.remove(handler)
    logger.disable("streamengine")


def messages_of(records, component):
    return [r["message"] for r in records if r["extra"].get("component") == component]


def strategy_for(client, idle=0.5, cap=GUARD, **kwargs):
    return StreamingCallStrategy(client, idle_timeout=idle, completion_timeout=cap, **kwargs)


def keep_alives(step, seconds=4.0, every=0.05):
    return [x for _ in range(int(seconds / every)) for x in (s.delay(every), step())]


# --------------------------------------------------------------------------- success

@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_a_streamed_answer_with_usage_events_and_observers(framing):
    class Recorder:
        def __init__(self):
            self.responses = []

        def on_llm_responded(self, response):
            self.responses.append(response)

    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(*s.reply("Hello, streaming world", pieces=5), s.delay(0.02), s.usage(prompt=7, completion=5))
        emitter = EventEmitter()
        events = []
        emitter.subscribe(events.append)
        recorder = Recorder()
        strategy = make_call_strategy(client, idle_timeout=GUARD, completion_timeout=GUARD,
                                      emitter=emitter, observers=[recorder])
        seen = []
        response = drive(strategy.stream_call(MESSAGES, options=CompletionOptions(model="m1"), on_chunk=seen.append))
    assert response.content == "Hello, streaming world"
    assert response.usage == Usage(7, 5, 12)
    assert (response.model, response.finish_reason) == ("m1", "stop")
    assert [e.is_final for e in events].count(True) == 1 and events[-1].response == response
    assert len(events) == len(seen) and seen[-1].is_completed
    assert recorder.responses == [response]
    assert fp.requests[0].json["model"] == "m1" and fp.requests[0].json["stream"] is True


def test_parallel_tool_calls_interleaved_by_index(fp, client):
    fp.add_turn(s.tool_call(0, id="c0", name="weather"), s.tool_call(1, id="c1", name="search"),
                s.tool_call(0, arguments='{"city": '), s.tool_call(1, arguments='{"q": "x"}'),
                s.tool_call(0, arguments='"Paris"}'))
    response = drive(strategy_for(client).stream_call(MESSAGES))
    assert response.tool_calls == (ToolCall("c0", "weather", '{"city": "Paris"}'),
                                   ToolCall("c1", "search", '{"q": "x"}'))
    assert response.finish_reason == "tool_calls"


# --------------------------------------------------------------------------- the meaningful-chunk rule

@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
@pytest.mark.parametrize("keep_alive", [s.comment, s.ping_event, s.empty_delta])
def test_keep_alives_do_not_mask_a_stall(framing, keep_alive):
    # Keep-alives flow for 4 s; the cap is 2.5 s.  If they reset the 0.5 s idle
    # timer, the cap would fire instead of the idle timeout.
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("a"), *keep_alives(keep_alive), s.stall())
        with pytest.raises(LlmTimeoutError) as info:
            drive(strategy_for(client, idle=0.5, cap=2.5).stream_call(MESSAGES))
    assert str(info.value) == "LLM streaming idle timeout: no meaningful chunk received for 0.5s (after 1 chunks)"
    assert (info.value.verb, info.value.chunks_received) == ("timed out", 1)


def test_keep_alives_only_is_no_response(fp, client):
    fp.add_turn(*keep_alives(s.comment), s.stall())
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy_for(client, idle=0.3, cap=2.0).stream_call(MESSAGES))
    assert str(info.value) == ("LLM streaming: no response received within 0.3s "
                               "(model may be unavailable or overloaded)")
    assert (info.value.verb, info.value.timeout_s, info.value.chunks_received) == ("unavailable", 0.3, 0)


# --------------------------------------------------------------------------- timeouts

@pytest.mark.parametrize("stall", [s.stall, s.stall_before_headers])
def test_a_silent_model_is_unavailable_and_the_warning_names_the_transport_error(fp, client, warnings, stall):
    fp.add_turn(stall())
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy_for(client, idle=0.25).stream_call(MESSAGES, options=CompletionOptions(model="slowpoke")))
    assert str(info.value).startswith("LLM streaming: no response received within 0.25s")
    assert info.value.verb == "unavailable"
    (line,) = messages_of(warnings, "streamengine._calls.strategies.StreamingCallStrategy")
    assert "model slowpoke" in line and "0 meaningful chunks" in line
    if stall is s.stall_before_headers:  # the one blocking read, bounded by the call's deadline
        assert isinstance(info.value.__cause__, LlmConnectionError)
        assert "transport: LlmConnectionError" in line and "sent no response headers within" in line
        assert "(inner: ReadTimeout" in line
    else:  # the wait on the socket came back at the deadline: no read had to fail
        assert info.value.__cause__ is None and "transport: nothing" in line


def test_silence_after_chunks_is_an_idle_timeout(fp, client):
    fp.add_turn(s.text("one"), s.text("two"), s.delay(0.01), s.text("three"), s.stall())
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy_for(client, idle=0.5).stream_call(MESSAGES))
    assert str(info.value) == "LLM streaming idle timeout: no meaningful chunk received for 0.5s (after 3 chunks)"


def test_the_cap_fires_while_chunks_flow(fp, client):
    fp.add_turn(*[x for _ in range(800) for x in (s.text("x"), s.delay(0.01))])
    seen = []
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy_for(client, idle=2.0, cap=0.8).stream_call(MESSAGES, on_chunk=seen.append))
    meaningful = sum(1 for c in seen if c.is_meaningful)
    assert str(info.value) == ("LLM streaming completion timeout: stream exceeded the 0.8s cap "
                               f"(after {meaningful} chunks)")
    assert (info.value.verb, info.value.chunks_received) == ("timed out", meaningful)
    assert meaningful > 1


def test_buffered_timeout_over_http(fp, client):
    class CompleteOnly(LlmClient):
        def complete(self, messages, tools=None, options=None, cancel=None):
            return client.complete(messages, tools, options, cancel)

    fp.add_turn(s.stall_before_headers())
    fp.add_turn(*s.reply("whole answer", pieces=3))
    strategy = make_call_strategy(CompleteOnly(), completion_timeout=0.3)
    assert isinstance(strategy, BufferedCallStrategy)
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES))
    assert str(info.value) == ("LLM buffered completion timeout: no response received within 0.3s "
                               "(model may be unavailable or overloaded)")
    assert info.value.verb == "unavailable"
    seen = []
    assert drive(strategy.stream_call(MESSAGES, on_chunk=seen.append)).content == "whole answer"
    assert [c.content for c in seen] == ["whole answer"] and fp.requests[1].json.get("stream") in (None, False)


# --------------------------------------------------------------------------- failures and cancel

def test_a_dropped_stream_is_a_failure_without_partial_content(fp, client):
    fp.add_turn(s.text("partial "), s.text("answer"), s.drop())
    with pytest.raises(LlmStreamError):
        drive(strategy_for(client, idle=GUARD).stream_call(MESSAGES))


def test_cancel_unblocks_a_stalled_stream(fp, client):
    cancel = threading.Event()
    first = threading.Event()
    fp.add_turn(s.text("a"), s.stall())
    cancelled_at = []

    def cancel_after_first_chunk():
        if first.wait(GUARD):
            cancelled_at.append(time.monotonic())
            cancel.set()

    canceller = threading.Thread(target=cancel_after_first_chunk)
    canceller.start()
    with pytest.raises(LlmCancelledError):
        # Without a working cancel the stall would end as a timeout (LlmTimeoutError), not a cancel.
        drive(strategy_for(client, idle=GUARD).stream_call(MESSAGES, cancel=cancel, on_chunk=lambda c: first.set()))
    assert cancelled_at
    canceller.join()


# --------------------------------------------------------------------------- failover

def test_failover_order_and_verbs_over_http(fp, client, warnings):
    fp.add_turn(s.http_error(503, {"error": {"message": "overloaded"}}))
    fp.add_turn(s.stall())
    fp.add_turn(s.text("half"), s.stall())
    fp.add_turn(s.error_frame("Overloaded", type="overloaded_error"))
    fp.add_turn(*s.reply("the answer", pieces=2), s.usage(prompt=3, completion=2))
    fo = ModelFailover(strategy_for(client, idle=0.5), ["a", "b", "c", "d", "e"])
    result = drive(fo.stream_call(MESSAGES, options=CompletionOptions(temperature=0.5)))
    assert (result.model, result.failovers, result.response.content) == ("e", 4, "the answer")
    assert result.response.usage == Usage(3, 2, 5)
    assert [r.json["model"] for r in fp.requests] == ["a", "b", "c", "d", "e"]
    assert all(r.json["temperature"] == 0.5 for r in fp.requests)
    lines = messages_of(warnings, "streamengine._calls.failover.ModelFailover")
    assert [line.split(" (")[0] for line in lines] == [
        "model a unavailable, failing over to b",
        "model b unavailable, failing over to c",
        "model c timed out, failing over to d",
        "model d unavailable, failing over to e",
    ]


def test_retry_after_beyond_the_cap_fails_over_at_once_over_http(fp, client, warnings):
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "120"}))
    fp.add_turn(*s.reply("from b"))
    fo = ModelFailover(strategy_for(client), ["a", "b"], max_retry_wait=5)
    backoffs = RecordedBackoffs()
    result = backoffs.call(fo, MESSAGES, cancel=CancelToken())
    assert (result.model, result.failovers, result.response.content) == ("b", 1, "from b")
    assert [r.json["model"] for r in fp.requests] == ["a", "b"]
    assert backoffs.waits == []  # no wait at all: the next model was asked at once
    lines = messages_of(warnings, "streamengine._calls.failover.ModelFailover")
    assert lines[0].startswith("model a rate limited (429) with Retry-After 120s, over the 5s cap")
    assert lines[1].startswith("model a rate limited (429), failing over to b")


def test_retry_after_beyond_the_cap_on_the_last_model_waits_the_cap_over_http(fp, client):
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "120"}))
    fp.add_turn(*s.reply("ok"))
    fo = ModelFailover(strategy_for(client), ["only"], max_retry_wait=0.05)
    backoffs = RecordedBackoffs()
    result = backoffs.call(fo, MESSAGES, cancel=CancelToken())
    assert (result.model, result.response.content) == ("only", "ok")
    assert backoffs.waits == [0.05]


def test_429_is_retried_honouring_retry_after(fp, client, warnings):
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"retry-after-ms": "50"}))
    fp.add_turn(*s.reply("ok"))
    fo = ModelFailover(strategy_for(client), ["a", "b"])
    backoffs = RecordedBackoffs()
    result = backoffs.call(fo, MESSAGES, cancel=CancelToken())
    assert (result.model, result.failovers, result.response.content) == ("a", 0, "ok")
    assert [r.json["model"] for r in fp.requests] == ["a", "a"]
    assert backoffs.waits == [0.05]
    assert messages_of(warnings, "streamengine._calls.failover.ModelFailover")[0].startswith(
        "model a rate limited (429), retrying in 0.05s")


def test_fatal_status_stops_at_once(fp, client):
    fp.add_turn(s.http_error(401, {"error": {"message": "invalid api key"}}))
    fp.add_turn(*s.reply("never"))
    with pytest.raises(LlmHttpError) as info:
        drive(ModelFailover(strategy_for(client), ["a", "b"]).stream_call(MESSAGES))
    assert info.value.status_code == 401
    assert fp.request_count == 1 and fp.turns_left == 1


def test_all_models_failed_over_http(fp, client):
    fp.add_turn(s.http_error(500, {"error": {"message": "boom"}}))
    fp.add_turn(s.http_error(404, {"error": {"message": "no such model"}}))
    with pytest.raises(AllModelsFailedError) as info:
        drive(ModelFailover(strategy_for(client), ["a", "b"]).stream_call(MESSAGES))
    assert [(m, e.status_code) for m, e in info.value.attempts] == [("a", 500), ("b", 404)]
    assert info.value.__cause__ is info.value.attempts[-1][1]
