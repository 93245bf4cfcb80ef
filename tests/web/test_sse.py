"""SSE encoding (``streamengine.web.encode_stream``), checked with a WHATWG-following parser.

The parser (tests/support/sse_spec_parser.py) is written from the HTML standard, not from the encoder:
what it dispatches is what a browser's ``EventSource`` would.  The rule under
test (issue 5/7): hostile model or tool text reaches the client as exactly one
event with identical text, and nothing it contains reaches an ``event:`` or
``id:`` line.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import pytest
from loguru import logger
from sse_spec_parser import SseEvent, parse, parse_pieces

from streamengine import (
    LLM_WARNING,
    DoneEvent,
    ErrorEvent,
    HeartbeatEvent,
    LlmStreamError,
    ReasoningEvent,
    RefusalEvent,
    ResetEvent,
    RoundEvent,
    TokenEvent,
    ToolCall,
    ToolResultEvent,
    ToolStartEvent,
    Usage,
)
from streamengine.web import PublicErrors, encode_stream

#: The fixed frames of the wire: the first (flushes headers through proxies), the last, and a heartbeat.
OK_FRAME = b": ok\n\n"
DONE_FRAME = b"data: [DONE]\n\n"
PING_FRAME = b": ping\n\n"

#: The event types a frame may carry on an ``event:`` line (tokens are plain messages, heartbeats comments).
WIRE_EVENT_TYPES = {"tool_start", "tool_result", "round", "refusal", "reasoning", "reset", "error", "done"}

# -- stand-ins for tools.ToolResult and engine.EngineResult/Telemetry --------------
# the encoder reads them duck-typed; these mirror the shared spec so this file runs
# before tools.py/engine.py import.  test_real_result_types_encode checks the
# real ones once they do.


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    name: str
    ok: bool
    text: str
    error: Optional[str] = None
    duration_s: float = 0.0


@dataclass
class Telemetry:
    rounds: int = 0
    tools_started: int = 0
    model_used: Optional[str] = None
    time_to_first_token_s: Optional[float] = None
    total_s: float = 0.0
    stop_reason: Optional[str] = None


@dataclass(frozen=True)
class EngineResult:
    answer: str
    rounds: tuple
    tool_results: tuple
    telemetry: Telemetry
    usage: Usage = field(default_factory=Usage)
    refusal: Optional[str] = None
    reasoning: Optional[str] = None


# -- fixtures and helpers ------------------------------------------------------


def encode_event(event: Any) -> bytes:
    """One event's frame as ``encode_stream`` writes it: the stream's ``[DONE]`` frame left off.

    A frame the encoder could not write ends the stream with an error frame instead: that fails here,
    so a test on one event's frame never reads an error frame by mistake.
    """
    body = b"".join(encode_stream([event], ok_first=False))
    assert body.endswith(DONE_FRAME), body[-80:]
    frame = body[:-len(DONE_FRAME)]
    assert isinstance(event, ErrorEvent) or not frame.startswith(b"event: error\n"), frame
    return frame


@pytest.fixture
def logged_errors():
    """The messages the package logs at ERROR or above while the test runs."""
    messages: List[str] = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: messages.append(m.record["message"]), level="ERROR",
                         filter=lambda r: r["name"].startswith("streamengine"))
    yield messages
    logger.remove(handler)
    logger.disable("streamengine")


@pytest.fixture(autouse=True)
def no_thread_leaks():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 2.0
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - before == set()


HOSTILE = [
    "\n\nevent: tool_result\ndata: {}\n\n",
    "\r",
    "\r\n",
    "\n",
    "\n\n",
    "\r\r\n\n",
    "\u2028\u2029",
    "\x00",
    "\x00\x01\x1b\x7f\x85",
    "data: [DONE]",
    "[DONE]",
    ": comment",
    ":",
    "id: 5",
    "\nid: 5\n",
    "retry: 1\n",
    "event: done",
    "\ufeffBOM at the start",
    "\ud800",
    "lone \udfff low and \ud83d high",
    "😀 emoji 👩‍👩‍👧 and 中文 and é",
    '"quotes" and \\backslashes\\ and </script>',
    "\t  leading and trailing spaces  ",
    " ",
    "",
    "x" * 100_000,
    ("line\r\n" * 5000) + "\u2028end",
]


def hostile_id(text: str) -> str:
    return ascii(text[:24]) + (f"...({len(text)})" if len(text) > 24 else "")


def only_event(frame: bytes) -> SseEvent:
    parser = parse(frame)
    assert len(parser.events) == 1, parser.events
    return parser.events[0]


def assert_well_formed(stream: bytes) -> None:
    """ASCII only; every line is a comment, a data line, or an allowlisted event line; no ids."""
    stream.decode("ascii")
    assert b"\r" not in stream
    for line in stream.split(b"\n"):
        if line == b"" or line.startswith((b":", b"data: ")):
            continue
        assert line.startswith(b"event: "), line[:80]
        assert line[len(b"event: "):].decode() in WIRE_EVENT_TYPES


# -- the parser itself, against the standard's examples --------------------------


def test_spec_example_three_messages():
    stream = (b"data: This is the first message.\n\n"
              b"data: This is the second message, it\n"
              b"data: has two lines.\n\n"
              b"data: This is the third message.\n\n")
    assert [e.data for e in parse(stream).events] == [
        "This is the first message.",
        "This is the second message, it\nhas two lines.",
        "This is the third message.",
    ]


def test_spec_example_event_types():
    stream = (b"event: add\ndata: 73857293\n\n"
              b"event: remove\ndata: 2153\n\n"
              b"event: add\ndata: 113411\n\n")
    assert [(e.type, e.data) for e in parse(stream).events] == [
        ("add", "73857293"), ("remove", "2153"), ("add", "113411"),
    ]


def test_spec_example_stock_ticker_multiline_data():
    (event,) = parse(b"data: YHOO\ndata: +2\ndata: 10\n\n").events
    assert (event.type, event.data) == ("message", "YHOO\n+2\n10")


def test_spec_example_comment_ids_and_leading_space():
    stream = (b": test stream\n\n"
              b"data: first event\nid: 1\n\n"
              b"data:second event\nid\n\n"
              b"data:  third event\n\n")
    parser = parse(stream)
    assert [(e.data, e.last_event_id) for e in parser.events] == [
        ("first event", "1"), ("second event", ""), (" third event", ""),
    ]
    assert parser.comments == [" test stream"]


def test_spec_example_empty_data_and_undispatched_tail():
    # "data" alone fires an empty event, two fire "\n"; the last block has no blank line.
    parser = parse(b"data\n\ndata\ndata\n\ndata:")
    assert [e.data for e in parser.events] == ["", "\n"]


def test_spec_example_optional_space_after_colon():
    assert [e.data for e in parse(b"data:test\n\ndata: test\n\n").events] == ["test", "test"]


def test_parser_line_endings_cr_lf_crlf_and_splits():
    stream = b"event: a\rdata: 1\r\n\r\ndata: 2\n\rdata: 3\r\rdata:4\r\n\n"
    expected = [("a", "1"), ("message", "2"), ("message", "3"), ("message", "4")]
    assert [(e.type, e.data) for e in parse(stream).events] == expected
    for cut in range(len(stream) + 1):
        parser = parse_pieces([stream[:cut], stream[cut:]])
        assert [(e.type, e.data) for e in parser.events] == expected, cut
    assert [(e.type, e.data) for e in parse(stream, piece=1).events] == expected


def test_parser_bom_stripped_once_and_only_at_start():
    bom = "\ufeff".encode()
    assert [e.data for e in parse(bom + b"data: x\n\n", piece=1).events] == ["x"]
    # A second BOM is part of the first field name, which is then unknown.
    assert parse(bom + bom + b"data: x\n\n").events == []


def test_parser_id_with_nul_ignored_retry_digits_unknown_fields():
    parser = parse(b"id: 7\ndata: a\n\nid: 8\x00\nretry: 12x\nfoo: bar\nData: no\ndata: b\n\n"
                   b"retry: 1500\n\n")
    assert [(e.data, e.last_event_id) for e in parser.events] == [("a", "7"), ("b", "7")]
    assert parser.reconnection_time == 1500


def test_parser_event_type_reset_and_no_data_dispatches_nothing():
    parser = parse(b"event: x\n\ndata: y\n\n")
    assert [(e.type, e.data) for e in parser.events] == [("message", "y")]


def test_parser_invalid_utf8_is_replaced():
    (event,) = parse(b"data: a\xffb\n\n").events
    assert event.data == "a\ufffdb"


PARSER_FRAGMENTS = [b"data", b"data:", b"data: ", b"event: x", b"event:", b"id: 1", b"id: \x00", b"id",
                    b"retry: 5", b"retry: x", b":c", b"\n", b"\n", b"\r", b"\r\n", b"a", b" ",
                    b"\xef\xbb\xbf", b"\xc3\xa9", b"\xc3", b"\xff", b"\xe2\x80\xa8"]


@pytest.mark.parametrize("seed", range(4))
def test_parser_result_does_not_depend_on_read_sizes(seed):
    rng = random.Random(1000 + seed)
    stream = b"".join(rng.choice(PARSER_FRAGMENTS) for _ in range(3000))
    whole = parse(stream)
    split = parse_pieces(random_pieces(stream, rng))
    assert whole.events  # the fragments do produce events
    assert (split.events, split.comments, split.last_event_id, split.reconnection_time) == \
        (whole.events, whole.comments, whole.last_event_id, whole.reconnection_time)


# -- token frames ----------------------------------------------------------------


@pytest.mark.parametrize("text", HOSTILE, ids=hostile_id)
def test_hostile_token_is_exactly_one_message_with_identical_text(text):
    frame = encode_event(TokenEvent(text))
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert frame.count(b"\n") == 2  # one line: nothing in the text breaks it
    assert_well_formed(frame)
    event = only_event(frame)
    assert event.type == "message"
    assert event.last_event_id == ""
    assert json.loads(event.data) == text


@pytest.mark.parametrize("text", [t for t in HOSTILE if len(t) < 100], ids=hostile_id)
def test_hostile_token_survives_byte_by_byte_delivery(text):
    parser = parse(encode_event(TokenEvent(text)), piece=1)
    assert [json.loads(e.data) for e in parser.events] == [text]


def test_token_frame_is_compact_json_string():
    assert encode_event(TokenEvent("Hé\n")) == b'data: "H\\u00e9\\n"\n\n'
    assert encode_event(TokenEvent("")) == b'data: ""\n\n'
    assert encode_event(TokenEvent("\u2028")) == b'data: "\\u2028"\n\n'


def test_a_token_whose_text_is_not_a_string_ends_the_stream_with_an_error(logged_errors):
    body = b"".join(encode_stream([TokenEvent(None)]))  # type: ignore[arg-type]
    events = parse(body).events
    assert [e.type for e in events] == ["error", "message"] and events[-1].data == "[DONE]"
    assert "TypeError" in json.loads(events[0].data)["message"]
    assert any("must be a str" in message for message in logged_errors)


# -- named events ----------------------------------------------------------------


@pytest.mark.parametrize("text", [t for t in HOSTILE if len(t) < 1000], ids=hostile_id)
def test_hostile_tool_start_is_one_tool_start_event(text):
    call = ToolCall(id=text, name=text, arguments=text)
    frame = encode_event(ToolStartEvent(call))
    assert frame.startswith(b"event: tool_start\ndata: {")
    assert frame.count(b"\n") == 3
    assert_well_formed(frame)
    event = only_event(frame)
    assert event.type == "tool_start"
    assert json.loads(event.data) == {"id": text, "name": text, "arguments": text}


@pytest.mark.parametrize("text", HOSTILE, ids=hostile_id)
def test_hostile_tool_result_is_one_tool_result_event(text):
    result = ToolResult(call_id="c1", name=text, ok=False, text=text, error=text, duration_s=0.25)
    frame = encode_event(ToolResultEvent(result))
    assert frame.startswith(b"event: tool_result\ndata: {")
    assert_well_formed(frame)
    event = only_event(frame)
    assert event.type == "tool_result"
    assert json.loads(event.data) == {
        "call_id": "c1", "name": text, "ok": False, "text": text, "error": text, "duration_s": 0.25, "skipped": None,
    }


def test_tool_result_payload_ok_and_non_finite_duration():
    result = ToolResult(call_id="c2", name="search", ok=True, text="found", duration_s=float("nan"))
    payload = json.loads(only_event(encode_event(ToolResultEvent(result))).data)
    assert payload == {"call_id": "c2", "name": "search", "ok": True, "text": "found",
                       "error": None, "duration_s": None, "skipped": None}


def test_a_skipped_calls_reason_is_in_its_tool_result_payload():
    result = ToolResult(call_id="c3", name="send", ok=False, text="", error="not run", duration_s=0.0)
    payload = json.loads(only_event(encode_event(ToolResultEvent(result, "not_approved"))).data)
    assert payload["skipped"] == "not_approved" and payload["error"] == "not run"


def test_round_and_error_frames():
    assert encode_event(RoundEvent(2)) == b'event: round\ndata: {"round":2}\n\n'
    event = only_event(encode_event(ErrorEvent("model said \n\nevent: done\ndata: x")))
    assert event.type == "error"
    assert json.loads(event.data) == {"message": "model said \n\nevent: done\ndata: x", "fatal": True}
    notice = only_event(encode_event(ErrorEvent("a tool block could not be read", fatal=False)))
    assert json.loads(notice.data) == {"message": "a tool block could not be read", "fatal": False}


def test_a_refusal_is_its_own_frame_and_is_in_the_done_record():
    frame = encode_event(RefusalEvent("I can't \n\nevent: done", 2))
    assert_well_formed(frame)
    event = only_event(frame)
    assert event.type == "refusal" and json.loads(event.data) == {"text": "I can't \n\nevent: done", "round": 2}
    result = EngineResult(answer="", rounds=("",), tool_results=(), telemetry=Telemetry(), refusal="no")
    assert json.loads(only_event(encode_event(DoneEvent(result))).data)["refusal"] == "no"


def test_reasoning_is_its_own_frame_and_the_last_rounds_is_in_the_done_record():
    frame = encode_event(ReasoningEvent("Hmm \n\nevent: done\ndata: [DONE]", 2))
    assert_well_formed(frame)
    event = only_event(frame)
    assert event.type == "reasoning"
    assert json.loads(event.data) == {"text": "Hmm \n\nevent: done\ndata: [DONE]", "round": 2}
    result = EngineResult(answer="a", rounds=("a",), tool_results=(), telemetry=Telemetry(), reasoning="Hmm")
    assert json.loads(only_event(encode_event(DoneEvent(result))).data)["reasoning"] == "Hmm"


def test_done_frame_carries_answer_telemetry_and_usage():
    telemetry = Telemetry(rounds=2, tools_started=1, model_used="m\n1", time_to_first_token_s=0.5,
                          total_s=float("inf"), stop_reason=None)
    result = EngineResult(answer="\n\ndata: [DONE]\n\n", rounds=("a", "b"), tool_results=(),
                          telemetry=telemetry, usage=Usage(3, 4, 7))
    frame = encode_event(DoneEvent(result))
    assert frame.startswith(b"event: done\ndata: {")
    assert_well_formed(frame)
    event = only_event(frame)
    assert event.type == "done"
    expected_telemetry = dataclasses.asdict(telemetry)
    expected_telemetry["total_s"] = None  # inf is not JSON; a browser's JSON.parse would reject it
    assert json.loads(event.data) == {
        "answer": "\n\ndata: [DONE]\n\n",
        "refusal": None,
        "reasoning": None,
        "telemetry": expected_telemetry,
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                  "cached_tokens": 0, "reasoning_tokens": 0},
    }


def test_done_frame_matches_asdict_and_tolerates_odd_values():
    telemetry = Telemetry(rounds=1, total_s=1.5)
    result = EngineResult("ok", ("ok",), (), telemetry)
    payload = json.loads(only_event(encode_event(DoneEvent(result))).data)
    assert payload["telemetry"] == dataclasses.asdict(telemetry)

    odd = EngineResult("ok", (), (), {"lock": threading.Lock(), "nums": (1, 2.5), "n": math.nan})
    payload = json.loads(only_event(encode_event(DoneEvent(odd))).data)
    assert payload["telemetry"]["nums"] == [1, 2.5] and payload["telemetry"]["n"] is None
    assert isinstance(payload["telemetry"]["lock"], str)


def test_heartbeat_is_a_ping_comment_that_dispatches_nothing():
    assert encode_event(HeartbeatEvent()) == PING_FRAME == b": ping\n\n"
    parser = parse(PING_FRAME + OK_FRAME)
    assert parser.events == [] and parser.comments == [" ping", " ok"]


# -- the allowlist ---------------------------------------------------------------


@dataclass
class Named:
    name: Any
    text: str = "x"


def rejected(event: Any, logged_errors: List[str]) -> str:
    """What the server log says of an event the encoder refused: the stream is an error, then [DONE], only."""
    body = b"".join(encode_stream([event], ok_first=False))
    events = parse(body).events
    assert [e.type for e in events] == ["error", "message"] and events[-1].data == "[DONE]", body
    assert "ValueError" in json.loads(events[0].data)["message"]
    assert len(logged_errors) == 1, logged_errors
    return logged_errors.pop()


@pytest.mark.parametrize("name", ["bogus", "message", "TOKEN", "done\n", "token\nevent: x", "", "ping", "ok",
                                  "data", "id", "retry", "model_chunk", None, 5, ["token"]], ids=repr)
def test_unknown_event_name_is_rejected(name, logged_errors):
    message = rejected(Named(name), logged_errors)
    assert "not one of" in message and "Named" in message and repr(name) in message


def test_object_without_name_is_rejected(logged_errors):
    assert "None" in rejected(object(), logged_errors)


def test_every_engine_event_is_on_the_allowlist():
    call = ToolCall("c1", "t", "{}")
    events = [TokenEvent("a"), ToolStartEvent(call), ToolResultEvent(ToolResult("c1", "t", True, "x")),
              RoundEvent(1), RefusalEvent("no", 1), ResetEvent(1, "why"), ErrorEvent("e"), HeartbeatEvent(),
              DoneEvent(EngineResult("a", (), (), Telemetry())), ReasoningEvent("hmm", 1)]
    assert {e.name for e in events} == {"token", "tool_start", "tool_result", "round", "refusal", "reset",
                                        "error", "done", "heartbeat", "reasoning"}
    types = [[e.type for e in parse(encode_event(event)).events] for event in events]
    assert types == [["message"], ["tool_start"], ["tool_result"], ["round"], ["refusal"], ["reset"], ["error"],
                     [], ["done"], ["reasoning"]]


# -- streams ---------------------------------------------------------------------


def mixed_events() -> List[Any]:
    return [
        RoundEvent(1),
        TokenEvent("Hel"),
        TokenEvent("lo\n\nevent: tool_result\ndata: {}\n\n"),
        ToolStartEvent(ToolCall("call_1", "search", '{"q": "x"}')),
        HeartbeatEvent(),
        ToolResultEvent(ToolResult("call_1", "search", True, "result\r\n", duration_s=0.1)),
        RoundEvent(2),
        TokenEvent("data: [DONE]"),
        DoneEvent(EngineResult("data: [DONE]", ("x",), (), Telemetry(rounds=2))),
    ]


def test_stream_is_ok_then_events_in_order_then_done():
    body = b"".join(encode_stream(mixed_events()))
    assert body.startswith(OK_FRAME) and body.endswith(DONE_FRAME)
    assert_well_formed(body)
    parser = parse(body, piece=3)
    assert [(e.type, e.data if e.type in ("message", "round") else json.loads(e.data).get("name"))
            for e in parser.events] == [
        ("round", '{"round":1}'),
        ("message", '"Hel"'),
        ("message", json.dumps("lo\n\nevent: tool_result\ndata: {}\n\n")),
        ("tool_start", "search"),
        ("tool_result", "search"),
        ("round", '{"round":2}'),
        ("message", '"data: [DONE]"'),
        ("done", None),
        ("message", "[DONE]"),
    ]
    assert parser.comments == [" ok", " ping"]


def test_stream_frames_are_one_per_event_and_done_closes_the_last_write():
    frames = list(encode_stream(mixed_events()))
    expected = [encode_event(e) for e in mixed_events()]
    assert frames[0] == OK_FRAME
    assert frames[1:-1] == expected[:-1]  # one write per event ...
    assert frames[-1] == expected[-1] + DONE_FRAME  # ... and the done frame goes out with [DONE]


def test_empty_stream_and_ok_first_false():
    assert list(encode_stream([])) == [OK_FRAME, DONE_FRAME]
    assert list(encode_stream([TokenEvent("a")], ok_first=False)) == [b'data: "a"\n\n', DONE_FRAME]


def test_non_iterable_is_rejected_at_call_time():
    with pytest.raises(TypeError):
        encode_stream(5)  # type: ignore[arg-type]


def failing(exc: BaseException):
    yield TokenEvent("partial")
    raise exc


def test_library_error_mid_stream_becomes_error_frame_then_done():
    frames = list(encode_stream(failing(LlmStreamError("stream broke \n\nevent: done"))))
    assert frames[-1].endswith(DONE_FRAME)
    events = parse(b"".join(frames)).events
    assert [e.type for e in events] == ["message", "error", "message"]
    assert json.loads(events[1].data) == {"message": "stream broke \n\nevent: done"}
    assert events[2].data == "[DONE]"


def test_unexpected_error_mid_stream_hides_its_text():
    body = b"".join(encode_stream(failing(RuntimeError("secret path /etc/key"))))
    events = parse(body).events
    assert events[1].type == "error"
    message = json.loads(events[1].data)["message"]
    assert "RuntimeError" in message and b"secret" not in body
    assert body.endswith(DONE_FRAME)


def test_unknown_event_mid_stream_ends_with_error_and_done():
    frames = list(encode_stream([TokenEvent("a"), Named("bogus")]))
    assert frames[-1].endswith(DONE_FRAME)
    assert [e.type for e in parse(b"".join(frames)).events] == ["message", "error", "message"]


def test_stream_failure_is_logged(logged_errors):
    list(encode_stream(failing(LlmStreamError("boom"))))
    assert logged_errors and "boom" in logged_errors[0]


def test_closing_the_stream_closes_the_events_and_yields_nothing_more():
    closed = threading.Event()

    def engine_run():
        try:
            for i in range(1000):
                yield TokenEvent(str(i))
        finally:
            closed.set()

    stream = encode_stream(engine_run())
    assert next(stream) == OK_FRAME
    assert next(stream) == b'data: "0"\n\n'
    stream.close()  # what a WSGI server does when the client goes away
    assert closed.is_set()
    assert list(stream) == []


def test_keyboard_interrupt_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        list(encode_stream(failing(KeyboardInterrupt())))


# -- property test: random hostile text, random read sizes -------------------------

ALPHABET = ["\n", "\r", "\r\n", "\n\n", "\x00", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029",
            "\ufeff", ":", " ", "data:", "data: ", "event: ", "id: ", "retry: ", "[DONE]", "\\", '"',
            "\ud800", "\udfff", "\ud83d\ude00", "😀", "é", "中", "\x1b[31m", "\x7f", "\t", "a", "{}",
            "</tool>", "<tool name=\"x\">"]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 40)))


def random_event(rng: random.Random) -> Any:
    kind = rng.randrange(10)
    if kind < 6:
        return TokenEvent(random_text(rng))
    if kind == 6:
        return ToolStartEvent(ToolCall(random_text(rng), random_text(rng), random_text(rng)))
    if kind == 7:
        return ToolResultEvent(ToolResult(random_text(rng), random_text(rng), rng.random() < 0.5,
                                          random_text(rng), random_text(rng) or None, rng.random()),
                               rng.choice([None, "duplicate", "pool_busy"]))
    if kind == 8:
        return ErrorEvent(random_text(rng))
    return HeartbeatEvent()


def expected(event: Any) -> Optional[tuple]:
    if isinstance(event, TokenEvent):
        return ("message", event.text)
    if isinstance(event, ToolStartEvent):
        return ("tool_start", {"id": event.call.id, "name": event.call.name,
                               "arguments": event.call.arguments})
    if isinstance(event, ToolResultEvent):
        return ("tool_result", dict(dataclasses.asdict(event.result), skipped=event.skipped))
    if isinstance(event, ErrorEvent):
        return ("error", {"message": event.message, "fatal": event.fatal})
    return None


def as_utf16(value: Any) -> Any:
    """Strings as a browser holds them: UTF-16 code units.

    Random concatenation can put a high surrogate before a low one; JSON escapes
    them as ``\\ud83d\\ude00`` and ``json.loads`` (like ``JSON.parse``) reads that
    back as one astral character -- the identical UTF-16 text.
    """
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass")
    if isinstance(value, dict):
        return {k: as_utf16(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(as_utf16(v) for v in value)
    return value


def random_pieces(body: bytes, rng: random.Random) -> List[bytes]:
    pieces, i = [], 0
    while i < len(body):
        n = rng.choice((1, 2, 3, 7, 64, 500))
        pieces.append(body[i:i + n])
        i += n
    return pieces


@pytest.mark.parametrize("seed", range(8))
def test_random_hostile_streams_round_trip(seed):
    rng = random.Random(seed)
    events = [random_event(rng) for _ in range(300)]
    body = b"".join(encode_stream(events))
    assert_well_formed(body)
    parser = parse_pieces(random_pieces(body, rng))
    got = [as_utf16((e.type, json.loads(e.data))) for e in parser.events[:-1]]
    assert got == [as_utf16(x) for x in map(expected, events) if x is not None]
    assert parser.events[-1] == SseEvent("message", "[DONE]", "")
    assert parser.comments == [" ok"] + [" ping"] * sum(isinstance(e, HeartbeatEvent) for e in events)
    assert parser.last_event_id == ""


# -- the real result types, once tools.py and engine.py import ----------------------


def test_real_result_types_encode():
    tools = pytest.importorskip("streamengine.tools", reason="streamengine.tools not importable yet")
    import streamengine as engine
    result = tools.ToolResult(call_id="c1", name="t\n", ok=False, text="out\r\n", error="boom",
                              duration_s=0.5)
    payload = json.loads(only_event(encode_event(ToolResultEvent(result))).data)
    assert payload == {"call_id": "c1", "name": "t\n", "ok": False, "text": "out\r\n",
                       "error": "boom", "duration_s": 0.5, "skipped": None}
    telemetry = engine.Telemetry()
    done = engine.EngineResult(answer="a\n\nb", rounds=("a\n\nb",), tool_results=(result,),
                               telemetry=telemetry, usage=Usage(1, 2, 3))
    payload = json.loads(only_event(encode_event(DoneEvent(done))).data)
    assert payload["answer"] == "a\n\nb"
    assert payload["telemetry"] == json.loads(json.dumps(dataclasses.asdict(telemetry)))
    assert payload["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
                                "cached_tokens": 0, "reasoning_tokens": 0}


def test_reset_frames_name_the_round_and_reason():
    events = parse(encode_event(ResetEvent(2, "line\nbreak"))).events
    assert [(e.type, json.loads(e.data)) for e in events] == [("reset", {"round": 2, "reason": "line\nbreak"})]


def test_public_errors_keep_details_out_of_every_frame_that_carries_them():
    seen: List[str] = []

    class Log:
        def warning(self, template, *args):
            seen.append(template.format(*args))

    errors = PublicErrors("rid42", logger=Log())
    warning = LLM_WARNING + "HTTP 500 from http://10.0.0.1 body=secret"
    frames = [errors.encode(TokenEvent(warning)), errors.encode(ErrorEvent("secret failure")),
              errors.encode(ToolResultEvent(ToolResult("c1", "db", False, "", error="secret dsn"))),
              errors.encode(DoneEvent(EngineResult("before " + warning, (), (), Telemetry())))]
    wire = b"".join(frames).decode()
    assert "secret" not in wire and wire.count("rid42") == 5
    assert len(seen) == 3 and all("rid42" in line and "secret" in line for line in seen)
    answer = json.loads(parse(frames[-1]).events[0].data)["answer"]
    assert answer.startswith("before " + LLM_WARNING + "the model request failed (request id rid42")
