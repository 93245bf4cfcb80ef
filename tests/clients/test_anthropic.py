"""AnthropicClient through real loopback HTTP (FakeProvider(wire="anthropic") on 127.0.0.1).

The wire the fake speaks is checked against the official SDK in
test_sdk_oracles.py; here the client reads it: chunks, requests, errors,
completion rules, cancel.  Latencies are guarded generously, never asserted
as speed.
"""
from __future__ import annotations

import json
import threading
from typing import Any, List

import pytest
from engine_calls import streamed
from http_support import FRAMINGS, MESSAGES, busy_connection_threads, cancel_while_blocked, provider_fixtures, text_of

from streamengine import (
    AnthropicClient,
    CancelToken,
    Chunk,
    CompletionOptions,
    ConfigError,
    EngineConfig,
    ErrorClass,
    ErrorClassifier,
    LlmCancelledError,
    LlmConnectionError,
    LlmHttpError,
    LlmProtocolError,
    LlmStreamError,
    Message,
    ModelChunkEvent,
    OpenAICompatibleClient,
    StreamingEngine,
    ToolCall,
    ToolSpec,
    ToolStartEvent,
    Usage,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

OPTIONS = CompletionOptions(model="claude-test")
BOM = b"\xef\xbb\xbf"
classify = ErrorClassifier().classify


pytestmark = pytest.mark.usefixtures("no_thread_leak")
fp, client = provider_fixtures("anthropic", api_key="sk-ant-test-key")


def collect(client: AnthropicClient, messages: Any = MESSAGES, **kwargs: Any) -> List[Chunk]:
    kwargs.setdefault("options", OPTIONS)
    return list(client.stream(messages, **kwargs))


def failing(client: AnthropicClient, fp: FakeProvider, *steps: Any) -> BaseException:
    fp.add_turn(*steps)
    with pytest.raises(Exception) as info:
        collect(client)
    return info.value


# -- reading the stream -------------------------------------------------------------------


@pytest.mark.parametrize("framing", FRAMINGS)
def test_text_thinking_tool_calls_usage_and_stop_reason(framing):
    with FakeProvider(framing=framing, wire="anthropic") as fp, AnthropicClient(fp.base_url) as client:
        fp.add_turn(s.reasoning("let me see"), s.text("Hel"), s.text("lo"),
                    s.tool_call(0, id="toolu_a", name="lookup", arguments='{"q": '),
                    s.tool_call(0, arguments='"x"}'),
                    s.tool_call(1, id="toolu_b", name="now"),
                    s.usage(prompt=11, completion=7))
        chunks, response = streamed(client, MESSAGES, OPTIONS)
    assert text_of(chunks) == "Hello"
    assert "".join(c.reasoning or "" for c in chunks) == "let me see"
    assert list(response.tool_calls) == [ToolCall("toolu_a", "lookup", '{"q": "x"}'),
                                         ToolCall("toolu_b", "now", "{}")]
    last = chunks[-1]
    assert last.is_completed and sum(c.is_completed for c in chunks) == 1
    assert (last.finish_reason, last.usage, last.model) == ("tool_calls", Usage(11, 7, 18), "claude-test")


@pytest.mark.parametrize("reason, expected", [("stop", "stop"), ("tool_calls", "tool_calls"),
                                              ("length", "length"), ("content_filter", "content_filter")])
def test_stop_reasons_map_to_finish_reasons(fp, client, reason, expected):
    fp.add_turn(s.text("x"), s.finish(reason))  # -> end_turn, tool_use, max_tokens, refusal on the wire
    assert collect(client)[-1].finish_reason == expected


def test_each_tool_call_is_complete_at_its_block_stop_not_at_the_end(fp, client):
    # A call must start as soon as its block stops: the server holds the rest of
    # the message until both tools have started.
    first_seen, second_seen = threading.Event(), threading.Event()

    @tool
    def first(a: int) -> str:
        """Notes that it ran."""
        first_seen.set()
        return "one"

    @tool
    def second(b: int) -> str:
        """Notes that it ran."""
        second_seen.set()
        return "two"

    fp.add_turn(s.tool_call(0, id="toolu_1", name="first", arguments='{"a": 1}'),
                s.tool_call(1, id="toolu_2", name="second", arguments='{"b": '),
                s.tool_call(1, arguments='2}'),
                s.text("done"),  # opens a text block: the second tool block stops first
                s.wait(second_seen, timeout=5), s.finish("tool_calls"))
    fp.add_turn(s.text("both ran"))
    both_before_the_end = []
    config = EngineConfig(models=["claude-test"], tool_mode="native")
    with StreamingEngine(client, [first, second], config) as engine:
        engine.emitter.subscribe(lambda event: both_before_the_end.append(first_seen.is_set() and second_seen.is_set())
                                 if isinstance(event, ModelChunkEvent) and event.is_final else None)
        events = list(engine.run(MESSAGES))
    started = [(e.call.id, e.call.args()) for e in events if isinstance(e, ToolStartEvent)]
    assert started == [("toolu_1", {"a": 1}), ("toolu_2", {"b": 2})]
    assert both_before_the_end[0] is True
    telemetry = events[-1].result.telemetry
    assert (telemetry.tools_started, telemetry.disallowed, telemetry.parse_errors) == (2, 0, 0)  # no empty call


def test_pings_comments_and_empty_deltas_are_not_meaningful(fp, client):
    fp.add_turn(s.ping_event(), s.comment(), s.empty_delta(), s.text("a"), s.ping_event())
    chunks = collect(client)
    assert [c.content for c in chunks if c.is_meaningful] == ["a", None]
    assert all(not c.is_meaningful for c in chunks if c.content is None and not c.is_completed)


@pytest.mark.parametrize("wire, make", [("anthropic", AnthropicClient), ("openai", OpenAICompatibleClient)])
def test_a_leading_bom_does_not_lose_the_first_event(wire, make):
    with FakeProvider(wire=wire) as fp, make(fp.base_url) as client:
        # The BOM arrives alone, then the first event: it must not swallow that event.
        fp.add_turn(s.raw(BOM), s.delay(0.01), s.text("first"), s.text(" second"))
        assert text_of(list(client.stream(MESSAGES, options=OPTIONS))) == "first second"
        assert fp.requests[0].path.endswith("/messages" if wire == "anthropic" else "/chat/completions")


def test_utf8_split_across_writes_and_crlf_endings(fp, client):
    euro = "\u20ac".encode("utf-8")
    wire = (b'event: message_start\r\ndata: {"type":"message_start","message":{"model":"m","usage":'
            b'{"input_tokens":2,"output_tokens":1}}}\r\n\r\n'
            b'event: content_block_start\r\ndata: {"type":"content_block_start","index":0,'
            b'"content_block":{"type":"text","text":""}}\r\n\r\n'
            b'event: content_block_delta\r\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"text_delta","text":"' + euro)
    rest = (b'!"}}\r\n\r\nevent: message_delta\r\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
            b'"usage":{"output_tokens":3}}\r\n\r\nevent: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n')
    fp.add_turn(s.raw(wire[:-2]), s.delay(0.01), s.raw(wire[-2:]), s.delay(0.01), s.raw(rest), auto_finish=False)
    chunks = collect(client)
    assert text_of(chunks) == "\u20ac!"
    assert (chunks[-1].usage, chunks[-1].finish_reason) == (Usage(2, 3, 5), "stop")


def test_usage_counts_cached_prompt_tokens_and_takes_the_last_cumulative_counts(fp, client):
    def event(kind: str, **payload: Any) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()

    fp.add_turn(s.raw(
        event("message_start", message={"model": "m", "usage": {
            "input_tokens": 10, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000,
            "output_tokens": 1}})
        + event("content_block_start", index=0, content_block={"type": "text", "text": "a"})
        + event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 5})
        + event("message_delta", delta={}, usage={"output_tokens": 9, "input_tokens": 20,
                                                  "cache_read_input_tokens": None})
        + event("message_stop")), auto_finish=False)
    chunks = collect(client)
    assert text_of(chunks) == "a"
    assert chunks[-1].usage == Usage(1120, 9, 1129, cached_tokens=1000) and chunks[-1].finish_reason == "stop"


# -- completion rules ---------------------------------------------------------------------


def test_thinking_signatures_are_kept_within_max_event_bytes(fp, client):
    """Signatures are opaque and counted by nothing else: many small ones may not grow memory without bound."""
    client.max_event_bytes = 4096
    start = ('event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"m",'
             '"usage":{"input_tokens":1}}}\n\n'
             'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
             '"content_block":{"type":"thinking","thinking":""}}\n\n')
    signature = ('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                 '"delta":{"type":"signature_delta","signature":"' + "s" * 1000 + '"}}\n\n')
    fp.add_turn(s.raw(start), s.forever(s.raw(signature), every=0.001))
    with pytest.raises(LlmProtocolError, match="thinking signatures of over 4096 characters"):
        collect(client)


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_stop_reason_without_message_stop_completes(framing):
    with FakeProvider(framing=framing, wire="anthropic") as fp, AnthropicClient(fp.base_url) as client:
        fp.add_turn(s.text("all there"), s.finish("stop"), s.end())
        chunks = collect(client)
    assert text_of(chunks) == "all there" and chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_body_ending_before_the_stop_reason_is_a_broken_stream(framing):
    with FakeProvider(framing=framing, wire="anthropic") as fp, AnthropicClient(fp.base_url) as client:
        fp.add_turn(s.text("half"), s.end())
        with pytest.raises(LlmStreamError, match="without message_stop or a stop reason"):
            collect(client)


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_connection_dropped_mid_stream_is_a_broken_stream(framing):
    with FakeProvider(framing=framing, wire="anthropic") as fp, AnthropicClient(fp.base_url) as client:
        fp.add_turn(s.text("half"), s.drop())
        with pytest.raises(LlmStreamError, match=r"broke|without message_stop") as info:
            collect(client)
    assert classify(info.value) is ErrorClass.TRANSIENT_ADVANCE


def test_a_cut_last_event_is_reported_with_its_size(fp, client):
    fp.add_turn(s.text("a"), s.raw(b'event: message_stop\ndata: {"type":"message_st'), s.end())
    with pytest.raises(LlmStreamError, match=r"bytes of an unfinished event were dropped"):
        collect(client)


def test_the_connection_is_reused_after_message_stop(fp, client):
    for word in ("one", "two", "three"):
        fp.add_turn(s.text(word))
    assert [text_of(collect(client)) for _ in range(3)] == ["one", "two", "three"]
    assert fp.connection_count == 1


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("status, kind, verdict", [
    (400, "invalid_request_error", ErrorClass.FATAL), (401, "authentication_error", ErrorClass.FATAL),
    (403, "permission_error", ErrorClass.FATAL), (404, "not_found_error", ErrorClass.TRANSIENT_ADVANCE),
    (429, "rate_limit_error", ErrorClass.TRANSIENT_RETRY), (500, "api_error", ErrorClass.TRANSIENT_ADVANCE),
    (529, "overloaded_error", ErrorClass.TRANSIENT_ADVANCE)])
def test_http_errors_name_the_type_and_message_and_classify_like_openai(fp, client, status, kind, verdict):
    error = failing(client, fp, s.http_error(status, {"type": "error", "error": {"type": kind, "message": "Why: x"}}))
    assert isinstance(error, LlmHttpError) and error.status_code == status
    assert f"HTTP {status}" in str(error) and f"{kind}: Why: x" in str(error)
    assert classify(error) is verdict


def test_429_retry_after_is_honoured(fp, client):
    error = failing(client, fp, s.http_error(429, {"type": "error", "error": {"type": "rate_limit_error",
                                                                               "message": "slow down"}},
                                             headers={"retry-after": "3"}))
    assert isinstance(error, LlmHttpError) and error.retry_after == 3.0 and "retry after 3s" in str(error)


def test_401_hint_names_the_anthropic_key_variable(fp, client):
    error = failing(client, fp, s.http_error(401, {"type": "error", "error": {"type": "authentication_error",
                                                                               "message": "invalid x-api-key"}}))
    assert "ANTHROPIC_API_KEY" in str(error)


@pytest.mark.parametrize("kind, expected, overloaded, verdict", [
    ("overloaded_error", LlmStreamError, True, ErrorClass.TRANSIENT_ADVANCE),
    ("api_error", LlmStreamError, False, ErrorClass.TRANSIENT_ADVANCE),
    ("invalid_request_error", LlmHttpError, None, ErrorClass.FATAL),
    ("rate_limit_error", LlmHttpError, None, ErrorClass.TRANSIENT_RETRY),
    ("something_new", LlmStreamError, False, ErrorClass.TRANSIENT_ADVANCE)])
def test_an_in_band_error_after_200_is_classified_like_its_http_status(fp, client, kind, expected, overloaded,
                                                                      verdict):
    error = failing(client, fp, s.text("partial"), s.error_frame("It went wrong", type=kind))
    assert type(error) is expected and f"{kind}: It went wrong" in str(error)
    if overloaded is not None:
        assert error.overloaded is overloaded
    assert classify(error) is verdict


def test_an_error_event_with_plain_text_data_keeps_the_text(fp, client):
    error = failing(client, fp, s.raw(b"event: error\ndata: upstream exploded\n\n"), s.end())
    assert isinstance(error, LlmStreamError) and "upstream exploded" in str(error)


@pytest.mark.parametrize("wire, says", [(b"event: content_block_delta\ndata: {nope\n\n", "not JSON"),
                                        (b"event: content_block_delta\ndata: [1, 2]\n\n", "not a JSON object")])
def test_frames_that_are_not_json_objects_are_protocol_errors(fp, client, wire, says):
    error = failing(client, fp, s.text("a"), s.raw(wire), s.end())
    assert isinstance(error, LlmProtocolError) and says in str(error)


def test_a_200_that_is_not_an_event_stream_is_a_protocol_error(fp, client):
    fp.add_turn(s.http_error(200, "<html>proxy login</html>", content_type="text/html"))
    with pytest.raises(LlmProtocolError, match=r"not 'text/event-stream'.*proxy login"):
        collect(client)


def test_no_scripted_turn_left_is_an_anthropic_api_error(fp, client):
    with pytest.raises(LlmHttpError, match="api_error: FakeProvider: no scripted turn left") as info:
        collect(client)
    assert info.value.status_code == 500


def test_a_refused_connection_is_a_connection_error():
    with FakeProvider(wire="anthropic") as fp:
        url = fp.base_url
    with AnthropicClient(url) as client, pytest.raises(LlmConnectionError, match="could not get an answer"):
        collect(client)


def test_the_api_key_is_never_shown(fp):
    key = "sk-ant-secret-123"
    with AnthropicClient(fp.base_url, api_key=key + "\n") as client:
        assert key not in repr(client)
        error = failing(client, fp, s.http_error(401, {"type": "error", "error": {
            "type": "authentication_error", "message": f"invalid x-api-key {key}"}}))
    assert key not in str(error) and "***" in str(error)
    assert fp.requests[0].headers["x-api-key"] == key


# -- requests -----------------------------------------------------------------------------


def test_request_shape_headers_and_max_tokens_default(fp):
    fp.add_turn(s.text("ok"))
    fp.add_turn(s.text("ok"))
    tools = [ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {"q": {"type": "string"}}}),
             ToolSpec("now")]
    with AnthropicClient(fp.base_url, api_key="k", anthropic_version="2023-06-01", default_max_tokens=321) as client:
        collect(client, tools=tools, options=CompletionOptions(model="claude-x", temperature=0.2, stop=["END"],
                                                               extra={"top_k": 5}))
        collect(client, options=CompletionOptions(model="claude-x", max_tokens=9))
    first, second = fp.requests
    assert first.path == "/v1/messages"
    assert (first.headers["x-api-key"], first.headers["anthropic-version"]) == ("k", "2023-06-01")
    assert "Authorization" not in first.headers
    assert first.json == {
        "model": "claude-x", "max_tokens": 321, "stream": True, "temperature": 0.2, "stop_sequences": ["END"],
        "top_k": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [{"name": "lookup", "description": "Look a word up.",
                   "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
                  {"name": "now", "input_schema": {"type": "object", "properties": {}}}]}
    assert second.json["max_tokens"] == 9


def test_a_conversation_with_tools_becomes_alternating_content_blocks(fp, client):
    fp.add_turn(s.text("ok"))
    conversation = [
        Message("system", "Be brief."),
        Message("system", "Use tools."),
        Message("user", "weather?"),
        Message("assistant", "Checking.", tool_calls=(ToolCall("toolu_1", "weather", '{"city": "Oslo"}'),
                                                      ToolCall("toolu_2", "clock", ""))),
        Message("tool", "rain", tool_call_id="toolu_1"),
        Message("tool", "ERROR: clock broke", tool_call_id="toolu_2"),
        Message("user", "The tools you called have finished..."),  # the engine's continuation
        Message("assistant", ""),  # an empty turn: the API refuses empty content
        Message("user", "and tomorrow?"),
    ]
    collect(client, conversation)
    body = fp.requests[0].json
    assert body["system"] == "Be brief.\n\nUse tools."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "ERROR: clock broke", "is_error": True},
            {"type": "text", "text": "The tools you called have finished..."},
            {"type": "text", "text": "and tomorrow?"}]},
    ]


def test_bad_calls_are_refused_before_any_request(fp, client):
    with pytest.raises(ConfigError, match="needs a model"):
        client.stream(MESSAGES)
    with pytest.raises(ConfigError, match="role 'robot'"):
        client.stream([{"role": "robot", "content": "x"}], options=OPTIONS)
    with pytest.raises(ConfigError, match="JSON"):
        client.stream(MESSAGES, options=CompletionOptions(model="m", extra={"bad": {1, 2}}))
    assert fp.request_count == 0


@pytest.mark.parametrize("kwargs, says", [
    ({"api_key": "sk-ant bad"}, "ANTHROPIC_API_KEY.*not shown"), ({"api_key": 42}, "must be a string"),
    ({"base_url": "api.anthropic.com"}, "http"), ({"default_max_tokens": 0}, "default_max_tokens"),
    ({"anthropic_version": "2023 06 01"}, "anthropic_version"), ({"connect_timeout": 0}, "connect_timeout")])
def test_bad_configuration_is_refused(kwargs, says):
    with pytest.raises(ConfigError, match=says):
        AnthropicClient(**kwargs)


def test_key_from_the_environment_and_base_url_with_v1(fp, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    fp.add_turn(s.text("ok"))
    with AnthropicClient(fp.base_url + "/v1/") as client:
        assert text_of(collect(client)) == "ok"
    assert fp.requests[0].headers["x-api-key"] == "sk-ant-from-env"
    assert fp.requests[0].path == "/v1/messages"


# -- complete() ---------------------------------------------------------------------------


def test_complete_returns_the_whole_answer(fp, client):
    fp.add_turn(s.text("Hello "), s.text("world"), s.usage(prompt=4, completion=2))
    fp.add_turn(s.tool_call(0, id="toolu_9", name="lookup", arguments='{"q": "x"}'))
    first = client.complete(MESSAGES, options=OPTIONS)
    assert (first.content, first.usage, first.model, first.finish_reason) == \
        ("Hello world", Usage(4, 2, 6), "claude-test", "stop")
    second = client.complete(MESSAGES, options=OPTIONS)
    assert second.tool_calls == (ToolCall("toolu_9", "lookup", '{"q": "x"}'),)
    assert second.finish_reason == "tool_calls"
    assert "stream" not in fp.requests[0].json


def test_complete_errors(fp, client):
    fp.add_turn(s.http_error(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    with pytest.raises(LlmHttpError, match="overloaded_error: Overloaded") as info:
        client.complete(MESSAGES, options=OPTIONS)
    assert classify(info.value) is ErrorClass.TRANSIENT_ADVANCE
    fp.add_turn(s.error_frame("bad field", type="invalid_request_error"))
    with pytest.raises(LlmHttpError, match="invalid_request_error: bad field") as info:
        client.complete(MESSAGES, options=OPTIONS)
    assert classify(info.value) is ErrorClass.FATAL
    fp.add_turn(s.raw("not json"))
    with pytest.raises(LlmProtocolError, match="not JSON"):
        client.complete(MESSAGES, options=OPTIONS)
    fp.add_turn(s.raw('{"choices": []}'))
    with pytest.raises(LlmProtocolError, match="'content' list"):
        client.complete(MESSAGES, options=OPTIONS)


# -- cancel -------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [threading.Event, CancelToken])
def test_cancel_before_headers_unblocks_at_once_and_the_client_goes_on(fp, client, token):
    fp.add_turn(s.stall_before_headers())
    fp.add_turn(s.text("after"))
    cancel = token()
    error, _ = cancel_while_blocked(fp, cancel, lambda: collect(client, cancel=cancel))
    assert isinstance(error, LlmCancelledError) and error.__cause__ is not None
    assert text_of(collect(client)) == "after"


@pytest.mark.parametrize("framing", FRAMINGS)
def test_cancel_mid_stream_unblocks_at_once(framing):
    with FakeProvider(framing=framing, wire="anthropic") as fp, AnthropicClient(fp.base_url) as client:
        fp.add_turn(s.text("a"), s.stall())
        cancel, got_first = CancelToken(), threading.Event()

        def read() -> None:
            for chunk in client.stream(MESSAGES, options=OPTIONS, cancel=cancel):
                if chunk.content:
                    got_first.set()

        error, _ = cancel_while_blocked(fp, cancel, read, ready=got_first)
        assert isinstance(error, LlmCancelledError)
        assert fp.wait_for_client_disconnects(1, 5)


def test_cancel_complete_before_headers_and_an_already_cancelled_call_sends_nothing(fp, client):
    done = threading.Event()
    done.set()
    with pytest.raises(LlmCancelledError):
        collect(client, cancel=done)
    assert fp.request_count == 0
    fp.add_turn(s.stall_before_headers())
    cancel = CancelToken()
    error, _ = cancel_while_blocked(fp, cancel, lambda: client.complete(MESSAGES, options=OPTIONS, cancel=cancel))
    assert isinstance(error, LlmCancelledError)


def test_the_connection_is_released_before_the_completed_chunk_is_handed_out(fp, client):
    fp.add_turn(s.text("a"), s.done(), s.stall())  # the server would hold the body open
    chunks = []
    for chunk in client.stream(MESSAGES, options=OPTIONS, cancel=threading.Event()):
        chunks.append(chunk)
        if chunk.is_completed:
            break
    assert busy_connection_threads(fp) == [] and chunks[-1].is_completed
