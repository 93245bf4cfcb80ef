"""OpenAICompatibleClient through real loopback HTTP (FakeProvider on 127.0.0.1).

Wire-level cases (CRLF, split UTF-8, multi-line data, framing) go through a
real socket because that is where they break; timing is asserted with
events, and the cancel latency is measured but guarded generously.
"""
from __future__ import annotations

import email.utils
import re
import socket
import threading
import time
from typing import Any, List

import pytest
from http_support import FRAMINGS, MESSAGES, busy_connection_threads, cancel_while_blocked, provider_fixtures, text_of

from streamengine import (
    AnthropicClient,
    CancellableAdapter,
    CancelToken,
    Chunk,
    CompletionOptions,
    ConfigError,
    LlmCancelledError,
    LlmConnectionError,
    LlmHttpError,
    LlmProtocolError,
    LlmStreamError,
    Message,
    OpenAICompatibleClient,
    ToolCallDelta,
    Usage,
    enable_logging,
)
from streamengine.testing import FakeProvider, fake_embedding
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")
fp, client = provider_fixtures("openai", api_key="sk-test-key")


def collect(client: OpenAICompatibleClient, **kwargs: Any) -> List[Chunk]:
    return list(client.stream(MESSAGES, **kwargs))


# -- parsing --------------------------------------------------------------------------


@pytest.mark.parametrize("framing", FRAMINGS)
def test_text_reasoning_and_tool_call_deltas_are_parsed(framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.reasoning("think"), s.text("Hel"), s.delay(0.01), s.text("lo"),
                    s.tool_call(0, id="c0", name="lookup", arguments='{"q":'),
                    s.tool_call(1, id="c1", name="other"), s.tool_call(0, arguments='"x"}'),
                    s.finish("tool_calls"), s.usage(prompt=7, completion=3))
        chunks = collect(client)
    assert [c.reasoning for c in chunks if c.reasoning] == ["think"]
    assert text_of(chunks) == "Hello"
    deltas = [d for c in chunks for d in c.tool_calls]
    assert deltas == [ToolCallDelta(0, "c0", "lookup", '{"q":'), ToolCallDelta(1, "c1", "other", None),
                      ToolCallDelta(0, None, None, '"x"}')]
    last = chunks[-1]
    assert last.is_completed and last.finish_reason == "tool_calls"
    assert last.usage == Usage(7, 3, 10) and last.model == "fake-model"
    assert [c.is_completed for c in chunks].count(True) == 1


def test_usage_frame_comes_last_and_completed_chunk_carries_it(fp, client):
    fp.add_turn(s.text("a"), s.finish("stop"), s.usage(prompt=2, completion=1))
    chunks = collect(client, options=CompletionOptions(model="m1"))
    assert chunks[-2].usage == Usage(2, 1, 3) and not chunks[-2].is_meaningful
    assert chunks[-2].finish_reason is None
    assert any(c.finish_reason == "stop" and not c.is_completed for c in chunks)
    assert chunks[-1] == Chunk(is_completed=True, finish_reason="stop", usage=Usage(2, 1, 3), model="m1",
                               response_id="chatcmpl-fake-1")


def test_reasoning_field_named_reasoning_is_accepted(fp, client):
    fp.add_turn(s.raw('data: {"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}\n\n'))
    assert [c.reasoning for c in collect(client) if c.reasoning] == ["hm"]


def test_empty_deltas_are_not_meaningful(fp, client):
    fp.add_turn(s.empty_delta(), s.tool_call(0), s.text("x"))
    chunks = collect(client)
    assert not chunks[0].is_meaningful and chunks[0] == Chunk(model="fake-model")
    assert not chunks[1].is_meaningful  # a tool-call delta carrying nothing
    assert chunks[2].content == "x"


def test_keep_alive_comments_and_ping_events_are_dropped(fp, client):
    fp.add_turn(s.comment(), s.text("a"), s.ping_event(), s.comment("x"), s.text("b"))
    chunks = collect(client)
    assert [c.content for c in chunks if c.content] == ["a", "b"]
    assert len(chunks) == 5  # a, b, finish, usage, completed


def test_crlf_line_endings_split_across_writes(fp, client):
    frame = '{"choices":[{"index":0,"delta":{"content":"crlf"}}]}'
    fp.add_turn(s.raw(f"data: {frame}\r"), s.delay(0.02), s.raw("\n\r"), s.delay(0.02),
                s.raw(f"\ndata: {frame}\r\n\r\n"), s.raw("data: [DONE]\r\n\r\n"), auto_finish=False)
    chunks = collect(client)
    assert text_of(chunks) == "crlfcrlf" and chunks[-1].is_completed


def test_utf8_character_split_across_writes(fp, client):
    frame = '{"choices":[{"index":0,"delta":{"content":"a€b"}}]}\n\n'.encode()
    cut = frame.index("€".encode()) + 1
    fp.add_turn(s.raw(b"data: " + frame[:cut]), s.delay(0.03), s.raw(frame[cut:]))
    assert text_of(collect(client)) == "a€b"


def test_multi_line_data_is_joined(fp, client):
    fp.add_turn(s.raw('data: {"choices":[{"index":0,\ndata: "delta":{"content":"joined"}}]}\n\n'))
    assert text_of(collect(client)) == "joined"


def test_invalid_utf8_is_replaced_not_fatal(fp, client):
    fp.add_turn(s.raw(b'data: {"choices":[{"index":0,"delta":{"content":"a\xff\xfeb"}}]}\n\n'))
    assert text_of(collect(client)) == "a\ufffd\ufffdb"


def test_done_stops_the_stream_and_later_bytes_are_ignored(fp, client):
    fp.add_turn(s.text("a"), s.done(), s.text("after"), s.raw("data: {not json\n\n"), s.stall())
    chunks = collect(client)
    assert text_of(chunks) == "a" and chunks[-1].is_completed and chunks[-1].finish_reason is None


@pytest.mark.parametrize("framing", FRAMINGS)
def test_finish_reason_without_done_completes(framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("a"), s.finish("length"), s.end())
        chunks = collect(client)
    assert chunks[-1].is_completed and chunks[-1].finish_reason == "length"


@pytest.mark.parametrize("framing", FRAMINGS)
def test_body_ending_without_finish_or_done_is_a_stream_error(framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("partial"), s.end())
        with pytest.raises(LlmStreamError, match=r"ended without a finish reason or \[DONE\]") as info:
            collect(client)
    assert type(info.value) is LlmStreamError


@pytest.mark.parametrize("framing", FRAMINGS)
def test_connection_dropped_mid_stream_is_a_stream_error(framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("partial"), s.drop())
        with pytest.raises(LlmStreamError) as info:
            collect(client)
    assert not isinstance(info.value, LlmCancelledError)


def test_truncated_last_event_is_reported(fp, client):
    fp.add_turn(s.text("a"), s.raw('data: {"choices":[{"index":0,"delta":{"content":"cut'), s.end())
    with pytest.raises(LlmStreamError, match="bytes of an unfinished event were dropped"):
        collect(client)


def test_connection_dropped_before_headers_is_a_connection_error(fp, client):
    fp.add_turn(s.drop())
    with pytest.raises(LlmConnectionError, match="closed the connection before answering") as caught:
        collect(client)
    assert str(caught.value).startswith(f"the server at {client.base_url} closed")
    assert "object at 0x" not in str(caught.value) and len(str(caught.value)) < 250


def test_in_band_error_frame_is_classified_by_its_type_or_status(fp, client):
    fp.add_turn(s.text("a"), s.error_frame("Overloaded", type="overloaded_error"))
    fp.add_turn(s.error_frame("bad tool schema", type="invalid_request_error", code="bad_schema"))
    fp.add_turn(s.raw('event: error\ndata: {"message": "rate limit reached", "code": 429}\n\n'))
    with pytest.raises(LlmStreamError, match="Overloaded") as first:
        collect(client)
    assert first.value.overloaded and "type=overloaded_error" in str(first.value)
    with pytest.raises(LlmHttpError, match="bad tool schema") as second:  # fatal, as an HTTP 400 is
        collect(client)
    assert second.value.status_code == 400 and "code=bad_schema" in str(second.value)
    with pytest.raises(LlmHttpError, match="rate limit reached") as third:  # retried, as a 429 is
        collect(client)
    assert third.value.status_code == 429


def test_invalid_json_frame_is_a_protocol_error(fp, client):
    fp.add_turn(s.text("a"), s.raw("data: {oops\n\n"))
    with pytest.raises(LlmProtocolError, match="not JSON"):
        collect(client)


def test_oversized_event_is_refused_with_bounded_memory(fp, client):
    client.max_event_bytes = 4096
    fp.add_turn(s.raw("data: " + "x" * 10000), s.stall())
    with pytest.raises(LlmProtocolError, match="grew past 4096 bytes"):
        collect(client)


def test_non_event_stream_200_is_a_protocol_error(fp, client):
    fp.add_turn(s.http_error(200, "<html>login</html>", content_type="text/html"))
    with pytest.raises(LlmProtocolError, match="text/html") as info:
        collect(client)
    assert "<html>login</html>" in str(info.value)


@pytest.mark.parametrize("framing", FRAMINGS)
def test_reads_are_prompt_on_every_framing(framing):
    """The first frame reaches the caller while the server still holds the rest back."""
    release, passed = threading.Event(), threading.Event()
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("first"), s.wait(release, timeout=5), s.signal(passed), s.text("second"))
        stream = client.stream(MESSAGES)
        first = next(stream)
        held_back = not passed.is_set()
        release.set()
        rest = list(stream)
    assert first.content == "first" and held_back
    assert text_of(rest) == "second"


# -- HTTP errors ----------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 503])
def test_http_errors_carry_status_body_and_provider_message(fp, client, status):
    fp.add_turn(s.http_error(status, {"error": {"message": f"provider says {status}"}}))
    with pytest.raises(LlmHttpError) as info:
        collect(client)
    err = info.value
    assert err.status_code == status and f"provider says {status}" in err.body
    assert f"HTTP {status}" in str(err) and f"provider says {status}" in str(err)


def test_http_error_body_is_cut_to_one_kilobyte(fp, client):
    fp.add_turn(s.http_error(500, "x" * 5000, content_type="text/plain"))
    with pytest.raises(LlmHttpError) as info:
        client.complete(MESSAGES)
    assert len(info.value.body) == 1024


@pytest.mark.parametrize("headers, expected", [
    ({"Retry-After": "3"}, 3.0),
    ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
    ({"Retry-After": "nan"}, None),
    ({"Retry-After": "-1"}, None),
    ({"Retry-After": "inf"}, None),
    ({"Retry-After": "100000"}, None),
    ({"Retry-After": "soon"}, None),
    ({}, None),
])
def test_retry_after_through_http(fp, client, headers, expected):
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers=headers))
    with pytest.raises(LlmHttpError) as info:
        collect(client)
    assert info.value.retry_after == expected


def test_retry_after_as_an_http_date_through_http(fp, client):
    """A date is counted from now (exact arithmetic at a fixed clock: faults/test_faults_retry_policy.py)."""
    fp.add_turn(s.http_error(429, {}, headers={"Retry-After": email.utils.formatdate(time.time() + 30, usegmt=True)}))
    with pytest.raises(LlmHttpError) as info:
        collect(client)
    assert 25.0 < info.value.retry_after <= 30.0


def test_connection_refused_is_a_connection_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with OpenAICompatibleClient(f"http://127.0.0.1:{port}/v1") as client:
        with pytest.raises(LlmConnectionError) as caught:
            collect(client)
        # The cause first, in plain words; urllib3's internals stay in the chain, not the message.
        assert str(caught.value) == (f"could not connect to http://127.0.0.1:{port}/v1: connection refused "
                                     f"\u2014 is the server running?")
        assert caught.value.__cause__ is not None
        with pytest.raises(LlmConnectionError):
            client.complete(MESSAGES)


# -- cancel ---------------------------------------------------------------------------


@pytest.mark.parametrize("token", [threading.Event, CancelToken])
@pytest.mark.parametrize("framing", FRAMINGS)
def test_cancel_before_headers_unblocks_at_once(token, framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.stall_before_headers())
        fp.add_turn(*s.reply("after"))
        cancel = token()
        error, _ = cancel_while_blocked(fp, cancel, lambda: collect(client, cancel=cancel))
        assert isinstance(error, LlmCancelledError) and error.__cause__ is not None
        assert text_of(collect(client)) == "after"  # the client is still usable


@pytest.mark.parametrize("token", [threading.Event, CancelToken])
@pytest.mark.parametrize("framing", FRAMINGS)
def test_cancel_mid_stream_unblocks_at_once(token, framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("a"), s.stall())
        cancel, got_first = token(), threading.Event()

        def read() -> None:
            for chunk in client.stream(MESSAGES, cancel=cancel):
                if chunk.content:
                    got_first.set()

        error, _ = cancel_while_blocked(fp, cancel, read, ready=got_first)
        assert isinstance(error, LlmCancelledError)


@pytest.mark.parametrize("token", [threading.Event, CancelToken])
def test_a_cancel_stops_the_events_of_a_read_already_made(token):
    """Three tokens in one read: a cancel set at the first is seen before the second (the loop's flag)."""
    frames = "".join('data: {"choices":[{"index":0,"delta":{"content":"' + t + '"}}]}\n\n' for t in "abc")
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.raw(frames), s.stall())
        cancel, seen = token(), []
        with pytest.raises(LlmCancelledError):
            for chunk in client.stream(MESSAGES, cancel=cancel):
                seen.append(chunk.content)
                cancel.set()
        assert seen == ["a"]


def test_cancel_complete_before_headers(fp, client):
    fp.add_turn(s.stall_before_headers())
    cancel = CancelToken()
    error, _ = cancel_while_blocked(fp, cancel, lambda: client.complete(MESSAGES, cancel=cancel))
    assert isinstance(error, LlmCancelledError)


def test_already_cancelled_call_sends_nothing(fp, client):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LlmCancelledError):
        collect(client, cancel=cancel)
    with pytest.raises(LlmCancelledError):
        client.complete(MESSAGES, cancel=cancel)
    assert fp.request_count == 0


def test_cancel_after_completion_does_not_touch_the_next_request(fp, client):
    fp.add_turn(*s.reply("one"))
    fp.add_turn(s.text("two"), s.delay(0.05), s.text("!"))
    cancel = CancelToken()
    assert client.complete(MESSAGES, cancel=cancel).content == "one"
    stream = client.stream(MESSAGES)
    assert next(stream).content == "two"
    cancel.set()  # the first call's token, long after it finished
    assert text_of(list(stream)) == "!"


def test_connection_is_released_before_the_completed_chunk_is_handed_out(fp, client):
    fp.add_turn(s.text("a"), s.done(), s.stall())  # the server would hold the body open
    stream = client.stream(MESSAGES, cancel=threading.Event())
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.is_completed:
            break
    assert busy_connection_threads(fp) == [] and chunks[-1].is_completed  # while ``stream`` is still referenced


def test_closing_the_iterator_early_releases_the_connection(fp, client):
    fp.add_turn(s.text("a"), s.stall())
    stream = client.stream(MESSAGES)
    assert next(stream).content == "a"
    stream.close()
    # The server sees the client go away and its handler ends (checked by the leak guard).


# -- complete / embed ------------------------------------------------------------------


def test_complete_returns_the_whole_answer(fp, client):
    fp.add_turn(s.text("Hello "), s.text("world"), s.usage(prompt=4, completion=2))
    fp.add_turn(s.tool_call(0, id="c1", name="lookup", arguments='{"q": '), s.tool_call(0, arguments='"x"}'))
    first = client.complete([Message("user", "hi")], options=CompletionOptions(model="m"))
    assert (first.content, first.usage, first.model, first.finish_reason) == \
        ("Hello world", Usage(4, 2, 6), "m", "stop")
    second = client.complete(MESSAGES)
    assert second.content == "" and second.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.args()) for c in second.tool_calls] == [("c1", "lookup", {"q": "x"})]
    assert fp.connection_count == 1  # keep-alive: both calls on one connection


def test_complete_errors(fp, client):
    fp.add_turn(s.raw("<html>not json</html>"))
    fp.add_turn(s.error_frame("server overloaded"))
    fp.add_turn(s.http_error(503, {"error": {"message": "busy"}}))
    with pytest.raises(LlmProtocolError, match="not JSON"):
        client.complete(MESSAGES)
    with pytest.raises(LlmStreamError, match="server overloaded") as info:
        client.complete(MESSAGES)
    assert info.value.overloaded
    with pytest.raises(LlmHttpError, match="busy"):
        client.complete(MESSAGES)


def test_no_turn_left_is_an_http_500(fp, client):
    with pytest.raises(LlmHttpError, match="no scripted turn left"):
        collect(client)


def test_embed_returns_vectors_in_input_order():
    with FakeProvider(embedding_dim=8, reverse_embeddings=True) as fp, \
            OpenAICompatibleClient(fp.base_url) as client:
        texts = ["red fox", "blue whale", "red fox", "x"]
        vectors = client.embed(texts, "emb-model")
        assert vectors == [fake_embedding(t, 8) for t in texts]
        assert vectors[0] == vectors[2] != vectors[1] != vectors[3]
        assert client.embed([], "emb-model") == []
        assert fp.requests[0].json == {"model": "emb-model", "input": texts}
        assert fp.request_count == 1
        fp.fail_embeddings(status=500, times=1)
        with pytest.raises(LlmHttpError, match="scripted embeddings failure"):
            client.embed(["x"], "emb-model")
        assert len(client.embed(["x"], "emb-model")) == 1
        with pytest.raises(ConfigError, match="list of texts"):
            client.embed("one string", "emb-model")  # type: ignore[arg-type]


# -- configuration and secrets -----------------------------------------------------------


def test_api_key_is_never_logged_nor_shown():
    key = "sk-very-secret-123"
    lines: List[str] = []
    handler = enable_logging(level="TRACE", sink=lines.append)
    try:
        with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key=key) as client:
            fp.add_turn(*s.reply("ok"))
            fp.add_turn(s.http_error(401, {"error": {"message": f"Incorrect API key provided: {key}"}}))
            collect(client)
            with pytest.raises(LlmHttpError) as info:
                collect(client)
            assert fp.requests[0].headers["Authorization"] == f"Bearer {key}"
            assert key not in repr(client)
    finally:
        from loguru import logger
        logger.remove(handler)
        logger.disable("streamengine")
    assert lines, "the client logged nothing at TRACE level"
    assert not any(key in line for line in lines)
    assert key not in str(info.value) and key not in info.value.body
    assert "Incorrect API key provided: ***" in str(info.value)


def test_from_env(monkeypatch):
    monkeypatch.setenv("STREAMENGINE_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.delenv("STREAMENGINE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    client = OpenAICompatibleClient.from_env(connect_timeout=2.0)
    assert client.base_url == "http://127.0.0.1:9/v1" and client._api_key == "sk-env"
    assert client.connect_timeout == 2.0
    monkeypatch.setenv("STREAMENGINE_API_KEY", "sk-mine")
    monkeypatch.delenv("STREAMENGINE_BASE_URL")
    other = OpenAICompatibleClient.from_env()
    assert other.base_url == "https://api.openai.com/v1" and other._api_key == "sk-mine"
    client.close()
    other.close()


@pytest.mark.parametrize("kwargs", [
    {"base_url": "127.0.0.1:8000/v1"}, {"base_url": "ftp://x/v1"},
    {"base_url": "http://x/v1", "connect_timeout": 0},
])
def test_bad_configuration_is_refused(kwargs):
    with pytest.raises(ConfigError):
        OpenAICompatibleClient(**kwargs)


@pytest.mark.parametrize("client_class", [OpenAICompatibleClient, AnthropicClient])
@pytest.mark.parametrize("value, says", [
    (True, "got True"), (float("nan"), "finite"), (float("inf"), "finite"), (-1, "> 0"), ("10", "number of seconds"),
])
def test_connect_timeout_is_refused_unless_a_finite_positive_number(client_class, value, says):
    # True is an int in Python: accepted, it would silently mean a one-second connect timeout.
    with pytest.raises(ConfigError, match=f"connect_timeout must be a .*{re.escape(says)}"):
        client_class("http://127.0.0.1:8000/v1", connect_timeout=value)


def test_bad_messages_are_refused_before_any_request(fp, client):
    with pytest.raises(ConfigError):
        client.stream({"role": "user", "content": "not a list"})  # type: ignore[arg-type]
    assert fp.request_count == 0


def test_a_given_session_is_used_and_left_open(fp):
    import requests

    session = requests.Session()
    with OpenAICompatibleClient(fp.base_url, session=session) as client:
        fp.add_turn(s.stall_before_headers())
        cancel = CancelToken()
        error, _ = cancel_while_blocked(fp, cancel, lambda: collect(client, cancel=cancel))
        assert isinstance(error, LlmCancelledError)
    assert isinstance(session.get_adapter(fp.base_url + "/chat/completions"), CancellableAdapter)
    assert not isinstance(session.get_adapter("http://example.com/"), CancellableAdapter)
    session.close()


@pytest.mark.parametrize("extra", [{"bad": {1, 2}}, {"temperature": float("nan")}])
def test_options_that_are_not_json_are_refused_at_the_call(fp, client, extra):
    with pytest.raises(ConfigError, match="cannot be sent as JSON"):
        client.stream(MESSAGES, options=CompletionOptions(extra=extra))
    with pytest.raises(ConfigError):
        client.complete(MESSAGES, options=CompletionOptions(extra=extra))
    assert fp.request_count == 0

