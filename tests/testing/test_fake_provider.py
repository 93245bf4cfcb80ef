"""FakeProvider itself: framing on the wire, the script, records, lifecycle.

Checked with plain http.client and raw sockets, so the provider is not
tested only through the client it is meant to test.
"""
from __future__ import annotations

import http.client
import importlib
import json
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

from streamengine.testing import FakeProvider, RecordedRequest, fake_embedding
from streamengine.testing import steps as s


def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Poll ``predicate``: a failure guard, not a speed assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.01)
    return bool(predicate())


@pytest.fixture(autouse=True)
def _threads(no_thread_leak):
    yield


def post(fp: FakeProvider, body: Dict[str, Any], path: str = "/v1/chat/completions",
         conn: Optional[http.client.HTTPConnection] = None) -> Tuple[http.client.HTTPResponse, bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", fp.port, timeout=5)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "X-Test": "yes"})
    resp = conn.getresponse()
    data = resp.read()
    if own:
        conn.close()
    return resp, data


def frames(data: bytes) -> List[Any]:
    out = []
    for block in data.decode("utf-8").split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            try:
                out.append(json.loads(payload))
            except ValueError:
                out.append(payload)  # [DONE] or a raw test frame
        elif block:
            out.append(block)
    return out


STREAM = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
WHOLE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_steps_are_reached_through_the_public_testing_package():
    testing = importlib.import_module("streamengine.testing")

    assert testing.steps is s and "steps" in testing.__all__ and "stall_before_headers" in s.__all__
    assert all(callable(getattr(s, name)) for name in s.__all__)


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_streamed_turn_on_each_framing(framing):
    with FakeProvider(framing=framing) as fp:
        fp.add_turn(s.text("Hé"), s.delay(0.01), s.reasoning("r"), s.tool_call(0, id="c", name="f", arguments="{}"))
        resp, data = post(fp, STREAM)
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    assert {"chunked": resp.getheader("Transfer-Encoding") == "chunked",
            "close": resp.getheader("Connection") == "close",
            "length": resp.getheader("Content-Length") == str(len(data))}[framing]
    got = frames(data)
    assert got[0]["choices"][0]["delta"] == {"content": "Hé"} and got[0]["model"] == "m"
    assert got[0]["object"] == "chat.completion.chunk"
    assert got[1]["choices"][0]["delta"] == {"reasoning_content": "r"}
    assert got[2]["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert got[3]["choices"][0]["finish_reason"] == "tool_calls"  # auto finish knows tool calls
    assert got[4]["choices"] == [] and got[4]["usage"]["total_tokens"] == 2
    assert got[5] == "[DONE]" and len(got) == 6


def test_auto_finish_adds_only_what_is_missing():
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"), s.finish("length"))
        fp.add_turn(s.text("a"), s.end())
        fp.add_turn(s.text("a"), s.done())
        fp.add_turn(s.text("a"), auto_finish=False)
        kinds = []
        for _ in range(4):
            _, data = post(fp, STREAM)
            kinds.append([f if isinstance(f, str) else
                          (f["choices"][0]["finish_reason"] if f["choices"] else "usage") for f in frames(data)])
    assert kinds == [[None, "length", "usage", "[DONE]"], [None], [None, "[DONE]"], [None]]


def test_comment_ping_empty_delta_error_frame_and_raw():
    with FakeProvider() as fp:
        fp.add_turn(s.comment(), s.ping_event(), s.empty_delta(), s.error_frame("boom", type="t", code=1),
                    s.raw(b"data: raw\n\n"), s.done())
        _, data = post(fp, STREAM)
    assert data.startswith(b": keep-alive\n\nevent: ping\ndata: ")
    got = frames(data)
    assert got[2]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert got[3] == {"error": {"message": "boom", "type": "t", "code": 1}}
    assert got[4] == "raw" and got[5] == "[DONE]"


def test_non_stream_request_gets_the_aggregated_completion():
    with FakeProvider() as fp:
        fp.add_turn(s.delay(0.01), *s.reply("Hello world", pieces=3), s.reasoning("why"),
                    s.tool_call(0, id="a", name="f", arguments='{"x"'), s.tool_call(0, arguments=": 1}"),
                    s.tool_call(1, id="b", name="g"), s.usage(prompt=5, completion=6))
        resp, data = post(fp, WHOLE)
    body = json.loads(data)
    assert resp.status == 200 and body["object"] == "chat.completion" and body["model"] == "m"
    message = body["choices"][0]["message"]
    assert message["content"] == "Hello world" and message["reasoning_content"] == "why"
    assert message["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}


def test_reasoning_in_either_chat_field_and_redacted_reasoning_that_chat_completions_cannot_carry():
    with pytest.raises(ValueError, match="reasoning_content, reasoning"):
        s.reasoning("x", field="thinking")
    with FakeProvider() as fp:
        turn = [s.reasoning("a", field="reasoning"), s.redacted_reasoning("opaque"), s.text("b")]
        fp.add_turn(*turn)
        fp.add_turn(*turn)
        _, streamed = post(fp, STREAM)
        _, whole = post(fp, WHOLE)
    deltas = [f["choices"][0]["delta"] for f in frames(streamed) if isinstance(f, dict) and f.get("choices")]
    assert deltas[:2] == [{"reasoning": "a"}, {"content": "b"}]  # nothing for the redacted step
    assert b"opaque" not in streamed and b"opaque" not in whole
    message = json.loads(whole)["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("a", "b") and "reasoning_content" not in message


def test_http_error_with_headers_and_no_turn_left():
    with FakeProvider() as fp:
        fp.add_turn(s.delay(0.01), s.http_error(429, {"error": {"message": "slow"}}, headers={"Retry-After": "2"}))
        fp.add_turn(s.http_error(502, "bad gateway", content_type="text/plain"))
        first, data = post(fp, STREAM)
        assert (first.status, first.getheader("Retry-After"), json.loads(data)) == \
            (429, "2", {"error": {"message": "slow"}})
        second, data = post(fp, WHOLE)
        assert (second.status, second.getheader("Content-Type"), data) == (502, "text/plain", b"bad gateway")
        third, data = post(fp, STREAM)
        assert third.status == 500 and b"no scripted turn left" in data
        assert fp.turns_left == 0


def test_turn_validation():
    with FakeProvider() as fp:
        with pytest.raises(ValueError, match="must be the first step"):
            fp.add_turn(s.text("a"), s.http_error(500))
        with pytest.raises(ValueError, match="must be the first step"):
            fp.add_turn(s.text("a"), s.stall_before_headers())
        with pytest.raises(TypeError, match="made of steps"):
            fp.add_turn("text")
        fp.add_turn(s.reply("abc", pieces=2))  # a list is flattened
        assert fp.turns_left == 1
    with pytest.raises(ValueError, match="framing"):
        FakeProvider(framing="gzip")


def test_reply_splits_text():
    assert [st.value["content"] for st in s.reply("abcdefg", pieces=3)] == ["abc", "def", "g"]
    assert [st.value["content"] for st in s.reply("ab", pieces=5)] == ["a", "b"]
    assert [st.value["content"] for st in s.reply("", pieces=2)] == [""]


def test_requests_are_recorded_and_countable():
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"))
        post(fp, STREAM)
        conn = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=5)
        conn.request("GET", "/v1/models")
        models = json.loads(conn.getresponse().read())
        conn.request("POST", "/v1/unknown", b"not json", {"Content-Length": "8"})
        unknown = conn.getresponse()
        unknown.read()
        conn.close()
        assert fp.wait_for_requests(3, timeout=1) and not fp.wait_for_requests(4, timeout=0.01)
        assert fp.request_count == 3
        first = fp.requests[0]
    assert isinstance(first, RecordedRequest)
    assert (first.method, first.path, first.json) == ("POST", "/v1/chat/completions", STREAM)
    assert first.headers["x-test"] == first.headers["X-Test"] == "yes"
    assert json.loads(first.body) == STREAM
    assert models["data"][0]["id"] == "fake-model" and unknown.status == 404
    assert fp.requests[2].json is None and fp.requests[2].body == b"not json"


@pytest.mark.parametrize("framing, connections", [("chunked", 1), ("length", 1), ("close", 2)])
def test_keep_alive(framing, connections):
    with FakeProvider(framing=framing) as fp:
        fp.add_turn(s.text("a"))
        fp.add_turn(s.text("b"))
        conn = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=5)
        assert b"[DONE]" in post(fp, STREAM, conn=conn)[1]
        assert b"[DONE]" in post(fp, STREAM, conn=conn)[1]
        conn.close()
        assert fp.connection_count == connections


def test_embeddings_are_deterministic_unit_vectors_and_can_fail():
    with FakeProvider(embedding_dim=12) as fp:
        fp.fail_embeddings(status=503, times=2)
        assert post(fp, {"input": ["a"]}, "/v1/embeddings")[0].status == 503
        assert post(fp, {"input": ["a"]}, "/v1/embeddings")[0].status == 503
        resp, data = post(fp, {"model": "e", "input": ["the cat", "The CAT!", "a dog"]}, "/v1/embeddings")
        single = json.loads(post(fp, {"input": "solo"}, "/v1/embeddings")[1])
        bad = post(fp, {"input": [1, 2]}, "/v1/embeddings")[0]
    body = json.loads(data)
    vectors = [item["embedding"] for item in body["data"]]
    assert resp.status == 200 and [item["index"] for item in body["data"]] == [0, 1, 2]
    assert vectors[0] == vectors[1] == fake_embedding("the cat", 12) and len(vectors[0]) == 12
    assert all(abs(sum(x * x for x in v) - 1) < 1e-9 for v in vectors)
    assert single["data"][0]["embedding"] == fake_embedding("solo", 12)
    assert fake_embedding("", 12) == fake_embedding("", 12) and sum(fake_embedding("", 12)) == 1.0
    assert bad.status == 400


def test_wait_holds_a_frame_and_signal_marks_progress():
    release, reached = threading.Event(), threading.Event()
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"), s.signal(reached), s.wait(release), s.text("b"))
        conn = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=5)
        conn.request("POST", "/v1/chat/completions", json.dumps(STREAM))
        resp = conn.getresponse()
        assert reached.wait(5)
        first = resp.read1(65536)
        assert b'"a"' in first and b'"b"' not in first
        release.set()
        rest = resp.read()
        conn.close()
    assert b'"b"' in rest and b"[DONE]" in rest


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_drop_cuts_the_body(framing):
    with FakeProvider(framing=framing) as fp:
        fp.add_turn(s.text("a"), s.drop())
        conn = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=5)
        conn.request("POST", "/v1/chat/completions", json.dumps(STREAM))
        resp = conn.getresponse()
        with pytest.raises(http.client.IncompleteRead):
            resp.read()
        conn.close()


def test_drop_before_headers_closes_without_answer():
    with FakeProvider() as fp:
        fp.add_turn(s.drop())
        conn = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=5)
        conn.request("POST", "/v1/chat/completions", json.dumps(STREAM))
        with pytest.raises(http.client.RemoteDisconnected):
            conn.getresponse()
        conn.close()


@pytest.mark.parametrize("step", [s.stall, s.stall_before_headers])
def test_close_ends_stalled_connections_and_joins_threads(step):
    fp = FakeProvider()
    # The request is recorded before the answer starts: wait until the server
    # stalls (everything before the signal is written), or a close that comes
    # in between finds no headers sent (a race seen under load).
    stalling = threading.Event()
    fp.add_turn(s.text("a"), s.signal(stalling), step()) if step is s.stall \
        else fp.add_turn(s.signal(stalling), step())
    sock = socket.create_connection(("127.0.0.1", fp.port), timeout=5)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(json.dumps(STREAM)), json.dumps(STREAM).encode()))
    assert fp.wait_for_requests(1)
    assert stalling.wait(5)
    fp.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(f"FakeProvider-{fp.port}")]
    received = b""
    while True:
        data = sock.recv(65536)
        if not data:
            break
        received += data
    sock.close()
    assert (b"HTTP/1.1 200" in received) == (step is s.stall)
    fp.close()  # idempotent


def test_stalled_handler_ends_when_the_client_goes_away():
    with FakeProvider() as fp:
        fp.add_turn(s.stall_before_headers())
        sock = socket.create_connection(("127.0.0.1", fp.port), timeout=5)
        body = json.dumps(STREAM).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert fp.wait_for_requests(1)
        sock.close()

        def handlers() -> List[threading.Thread]:
            return [t for t in threading.enumerate() if t.name == f"FakeProvider-{fp.port}-conn"]

        assert wait_for(lambda: not handlers(), timeout=5)


def test_delay_is_cut_short_by_close():
    fp = FakeProvider()
    fp.add_turn(s.text("a"), s.delay(30))
    sock = socket.create_connection(("127.0.0.1", fp.port), timeout=5)
    body = json.dumps(STREAM).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert fp.wait_for_requests(1)
    fp.close()  # would hang for 30 s if the delay were not interruptible
    sock.close()


# -- fault steps added for the fault matrix (issue 7) -----------------------------------------------


def _open_stream(fp: FakeProvider) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", fp.port), timeout=5)
    body = json.dumps(STREAM).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _read_until(sock: socket.socket, needle: bytes, limit: int = 1 << 20) -> bytes:
    data = b""
    while needle not in data and len(data) < limit:
        part = sock.recv(65536)
        if not part:
            break
        data += part
    return data


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_forever_repeats_frames_until_the_client_leaves_and_counts_the_disconnect(framing):
    with FakeProvider(framing=framing) as fp:
        fp.add_turn(s.text("a"), s.forever(s.comment("still here"), every=0.01))
        sock = _open_stream(fp)
        data = b""
        while data.count(b": still here") < 3:
            part = sock.recv(65536)
            assert part, "the provider ended a forever() stream"
            data += part
        if framing == "length":
            declared = int(data.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            assert declared > 1 << 30  # never reached: the body never "ends" early
        assert fp.client_disconnects == 0
        sock.close()
        assert fp.wait_for_client_disconnects(1)
        assert fp.client_disconnects == 1


def test_forever_takes_frame_steps_only():
    with pytest.raises(ValueError, match="frame steps"):
        s.forever(s.delay(1))
    with pytest.raises(ValueError, match="frame steps"):
        s.forever()
    with pytest.raises(ValueError, match="positive"):
        s.forever(s.comment(), every=0)


def test_trickle_sends_one_byte_at_a_time_then_goes_on():
    release = threading.Event()
    with FakeProvider(framing="chunked") as fp:
        fp.add_turn(s.trickle(b"data: {}\n\n", interval=0.001), s.wait(release), s.text("after"))
        sock = _open_stream(fp)
        data = _read_until(sock, b"\n\r\n1\r\n\n\r\n")  # each byte its own chunk; the last two are "\n"
        assert data.split(b"\r\n\r\n", 1)[1] == b"".join(b"1\r\n%c\r\n" % c for c in b"data: {}\n\n")
        release.set()
        assert b'"after"' in _read_until(sock, b"0\r\n\r\n")
        sock.close()


def test_a_provider_closing_is_not_a_client_disconnect():
    fp = FakeProvider()
    fp.add_turn(s.stall())
    sock = _open_stream(fp)
    assert _read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 200")
    fp.close()
    sock.close()
    assert fp.client_disconnects == 0


def test_max_recorded_keeps_the_latest_requests_and_counts_all():
    with FakeProvider(max_recorded=2) as fp:
        fp.respond_with(lambda payload: [s.text("x")])
        for i in range(5):
            post(fp, {"messages": [{"role": "user", "content": str(i)}], "stream": True})
        assert fp.request_count == 5 and fp.wait_for_requests(5)
        assert [r.json["messages"][0]["content"] for r in fp.requests] == ["3", "4"]


# -- the Anthropic wire ---------------------------------------------------------------------


def anthropic_events(data: bytes) -> List[Tuple[str, Any]]:
    """``(event name, data)`` of a named-event stream; comments and raw text kept as ``("", text)``."""
    out: List[Tuple[str, Any]] = []
    for block in data.decode("utf-8").split("\n\n"):
        if block.startswith("event: ") and "\ndata: " in block:
            name, payload = block[len("event: "):].split("\ndata: ", 1)
            parsed = json.loads(payload)
            assert parsed["type"] == name  # the data repeats the event name, as the API's does
            out.append((name, parsed))
        elif block:
            out.append(("", block))
    return out


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_anthropic_wire_streams_the_steps_as_message_events(framing):
    with FakeProvider(framing=framing, wire="anthropic") as fp:
        assert fp.base_url == f"http://127.0.0.1:{fp.port}" and "wire='anthropic'" in repr(fp)
        fp.add_turn(s.reasoning("r"), s.text("H\u00e9"), s.delay(0.01), s.text("!"),
                    s.tool_call(0, id="toolu_1", name="f", arguments='{"a":'), s.tool_call(0, arguments=" 1}"),
                    s.tool_call(1, name="g"), s.usage(prompt=5, completion=6))
        resp, data = post(fp, STREAM, path="/v1/messages")
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    assert framing != "length" or resp.getheader("Content-Length") == str(len(data))
    got = anthropic_events(data)
    assert [name for name, _ in got] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  # thinking
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  # text
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  # tool 0
        "content_block_start", "content_block_stop",  # tool 1, no input
        "message_delta", "message_stop"]
    start = got[0][1]["message"]
    assert (start["id"], start["model"], start["usage"]["input_tokens"]) == ("msg_fake_1", "m", 5)
    assert got[2][1]["delta"] == {"type": "thinking_delta", "thinking": "r"}
    assert got[3][1]["delta"]["type"] == "signature_delta"
    assert [got[i][1]["delta"]["text"] for i in (6, 7)] == ["H\u00e9", "!"]
    assert got[9][1] == {"type": "content_block_start", "index": 2, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}
    assert [got[i][1]["delta"]["partial_json"] for i in (10, 11)] == ['{"a":', " 1}"]
    assert got[13][1]["content_block"]["name"] == "g" and got[13][1]["content_block"]["id"].startswith("toolu_")
    assert got[15][1]["delta"]["stop_reason"] == "tool_use" and got[15][1]["usage"] == {"output_tokens": 6}


def test_anthropic_wire_encodes_pings_comments_errors_and_raw_bytes():
    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.raw(b"\xef\xbb\xbf"), s.comment(), s.ping_event(), s.empty_delta(),
                    s.error_frame("Overloaded", type="overloaded_error"), s.end())
        fp.add_turn(s.error_frame("no type"), s.end())
        _, data = post(fp, STREAM, path="/v1/messages")
        _, second = post(fp, STREAM, path="/v1/messages")
    assert data.startswith(b"\xef\xbb\xbfevent: message_start\n")  # raw bytes go first, verbatim
    got = anthropic_events(data[3:])
    assert [name for name, _ in got] == ["message_start", "", "ping", "ping", "error"]
    assert got[4][1]["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert anthropic_events(second)[-1][1]["error"]["type"] == "api_error"


def test_anthropic_wire_whole_answers_errors_and_routes():
    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.reasoning("why"), *s.reply("Hello world", pieces=3),
                    s.tool_call(0, id="a", name="f", arguments='{"x"'), s.tool_call(0, arguments=": 1}"),
                    s.finish("length"), s.usage(prompt=5, completion=6))
        fp.add_turn(s.error_frame("bad", type="invalid_request_error"))
        resp, data = post(fp, WHOLE, path="/v1/messages")
        _, error = post(fp, WHOLE, path="/v1/messages")
        empty, none_left = post(fp, WHOLE, path="/v1/messages")
        wrong, _ = post(fp, STREAM)  # the OpenAI route is not served on this wire
    assert resp.status == 200 and json.loads(data) == {
        "id": "msg_fake_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "thinking", "thinking": "why", "signature": "ZmFrZS1zaWduYXR1cmU="},
                    {"type": "text", "text": "Hello world"},
                    {"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}}],
        "stop_reason": "max_tokens", "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 6}}
    assert json.loads(error) == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert empty.status == 500 and json.loads(none_left)["error"]["type"] == "api_error"
    assert wrong.status == 404


def test_wire_is_validated():
    with pytest.raises(ValueError, match="wire must be one of openai, anthropic"):
        FakeProvider(wire="grpc")
