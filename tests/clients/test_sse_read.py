"""SSE reading in memory, through the path a streamed answer takes (``iter_event_batches``).

Parsers do no I/O, so these feed byte slices straight in; the same cases
over real sockets are in the client tests (BOM: test_anthropic.py).

Private on purpose: the SSE line parser is an algorithm, fed here at every split offset, which no
HTTP test can choose.
"""
from __future__ import annotations

import itertools
from typing import Iterable, List, Tuple

import pytest

from streamengine._clients.http.sse_read import SseEventTooLarge, SseFramer, _parsed, event_fields, iter_event_batches

WIRE = ("data: one\r\n\r\n: comment\n\ndata: t\u00e9\u20ac\ndata: two\n\n"
        "event: ping\rdata: {}\r\rdata: three\n\r\ndata: \U0001F600\r\n\n").encode("utf-8")
EXPECTED = [("message", "one"), ("message", "t\u00e9\u20ac\ntwo"), ("ping", "{}"),
            ("message", "three"), ("message", "\U0001F600")]
BOM = b"\xef\xbb\xbf"
ANTHROPIC_WIRE = (b'event: message_start\ndata: {"type":"message_start"}\n\n'
                  b'event: ping\ndata: {"type": "ping"}\n\n'
                  b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
ANTHROPIC_EXPECTED = [("message_start", '{"type":"message_start"}'), ("ping", '{"type": "ping"}'),
                      ("message_stop", '{"type":"message_stop"}')]


def parse(reads: Iterable[bytes], framer: SseFramer = None) -> List[Tuple[str, str]]:
    return list(itertools.chain.from_iterable(iter_event_batches(reads, framer or SseFramer())))


def every_split(wire: bytes):
    yield [wire]
    yield [wire[i:i + 1] for i in range(len(wire))]
    for cut in range(1, len(wire)):
        yield [wire[:cut], wire[cut:]]


def test_split_at_every_offset_gives_the_same_events():
    for reads in every_split(WIRE):
        assert parse(reads) == EXPECTED, reads


@pytest.mark.parametrize("wire, expected", [(WIRE, EXPECTED), (ANTHROPIC_WIRE, ANTHROPIC_EXPECTED)],
                         ids=["mixed-endings", "named-events"])
def test_a_leading_bom_is_stripped_wherever_the_reads_split_it(wire, expected):
    # Before: the BOM stayed in the first field name ("\ufeffdata") and the first event was lost.
    for reads in every_split(BOM + wire):
        assert parse(reads) == expected, reads


def test_only_the_leading_bom_is_stripped():
    # A second BOM is content (U+FEFF), not a marker; a stream of only a BOM prefix ends empty.
    assert parse([BOM + BOM + b"data: a\n\n"]) == []  # "\ufeffdata" is an unknown field: ignored
    assert parse([BOM, b"data: \xef\xbb\xbfx\n\n"]) == [("message", "\ufeffx")]
    framer = SseFramer()
    assert parse([b"\xef\xbb"], framer) == [] and framer.dropped_bytes == 2


def test_trailing_event_without_its_empty_line_is_dropped():
    # WHATWG: an event not ended by an empty line when the body ends is not
    # dispatched -- also when its lines are complete (a cut body must never
    # look complete).
    framer = SseFramer()
    assert parse([b"data: a\n\ndata: [DONE]\n"], framer) == [("message", "a")]
    assert framer.dropped_bytes == len(b"data: [DONE]")
    framer = SseFramer()
    assert parse([b"data: a\n\ndata: {\"cut"], framer) == [("message", "a")]
    assert framer.dropped_bytes == len(b'data: {"cut')
    framer = SseFramer()
    assert parse([b"data: a\r\n\r\n"], framer) == [("message", "a")]
    assert framer.dropped_bytes == 0


def test_invalid_utf8_is_replaced_even_when_split():
    data = b"data: a\xe2\x82\n\ndata: \xff\n\ndata: \xe2\x82"
    assert parse([data[i:i + 1] for i in range(len(data))] + [b"\xac\n\n"]) == [
        ("message", "a\ufffd"), ("message", "\ufffd"), ("message", "\u20ac")]


def test_event_over_the_size_cap_is_refused():
    framer = SseFramer(max_event_bytes=1 << 20)
    piece = b"data: " + b"x" * 65536
    with pytest.raises(SseEventTooLarge, match="grew past"):
        parse([piece] * 40, framer)
    assert len(framer._buf) == 0  # the held bytes were released


def test_many_line_event_over_the_work_budget_is_refused_and_the_framer_goes_on():
    framer = SseFramer(max_event_bytes=1 << 20, max_event_work=1 << 20)
    with pytest.raises(SseEventTooLarge, match="work limit"):
        framer.feed_fields(b"data: x\n" * 50000 + b"\n")
    assert framer.feed_fields(b"data: " + b"y" * 500000 + b"\n\n") == [("message", "y" * 500000)]


@pytest.mark.parametrize("raw", [
    b"event: ping\ndata: {}", b"event:ping\ndata:{}", b"event:  two spaces\ndata:  x", b"event: \ndata: x",
    b"event:\ndata:", b"event: a\ndata", b"event: a\nid: 1", b"event: a\n: comment",
    b"event: e\xc3\xa9\ndata: \xe2\x82\xac",
    b"event:  x\ndata: y", b"event: a\ndata:  {}", b"event: a\ndata:",
])
def test_the_named_event_fast_path_reads_what_sseclient_reads(raw):
    event = _parsed(raw)
    expected = [] if event is None else [(event.event, event.data)]
    assert event_fields([raw]) == expected
    assert SseFramer().feed_fields(b"data: x\n\n" + raw + b"\n\n") == [("message", "x")] + expected
