"""A WHATWG-following ``text/event-stream`` parser, used only by the tests.

Written from the HTML standard ("Interpreting an event stream",
https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation),
not from the package's SSE encoder: the encoder is checked against what a browser's
``EventSource`` would dispatch, so a bug shared by encoder and parser cannot
hide.  Each rule below cites the step of the standard it implements.

It is incremental (``feed`` any byte slices, e.g. one byte at a time) and does
no I/O.  Beyond the standard it *records* comments and ``retry`` values so tests
can see heartbeats; recording changes nothing about what is dispatched.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Iterable, List, Optional

LF = "\n"
CR = "\r"
BOM = "\ufeff"


@dataclass(frozen=True)
class SseEvent:
    """What ``EventSource`` would dispatch: a ``MessageEvent`` of ``type``."""

    type: str
    data: str
    last_event_id: str


class SpecParser:
    """Feed bytes; collect dispatched :class:`SseEvent` objects in ``events``."""

    def __init__(self) -> None:
        # "Streams must be decoded using the UTF-8 decode algorithm": invalid
        # bytes become U+FFFD, and one leading BOM is stripped (see _decode).
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_stream_start = True
        self._line_parts: List[str] = []  # the line not yet ended by CR, LF or CRLF
        self._after_cr = False      # the last character seen was a CR
        self._data = ""             # the data buffer
        self._event_type = ""       # the event type buffer
        self._last_event_id_buffer = ""
        self.last_event_id = ""     # the "last event ID string" of the EventSource
        self.reconnection_time: Optional[int] = None
        self.events: List[SseEvent] = []
        self.comments: List[str] = []
        self.closed = False

    # -- input ---------------------------------------------------------------
    def feed(self, data: bytes) -> List[SseEvent]:
        """Process ``data``; return the events it dispatched (also appended to ``events``)."""
        if self.closed:
            raise RuntimeError("SpecParser.feed after close()")
        before = len(self.events)
        self._consume(self._decode(self._decoder.decode(data)))
        return self.events[before:]

    def close(self) -> List[SseEvent]:
        """End of stream: "any pending data must be discarded" — an event without
        its blank line is never dispatched."""
        before = len(self.events)
        self._consume(self._decode(self._decoder.decode(b"", final=True)))
        self._line_parts = []
        self._data = ""
        self._event_type = ""
        self.closed = True
        return self.events[before:]

    def _decode(self, text: str) -> str:
        # UTF-8 decode strips a single leading BOM, and only at the stream start.
        if self._at_stream_start and text:
            self._at_stream_start = False
            if text.startswith(BOM):
                text = text[1:]
        return text

    # -- lines ---------------------------------------------------------------
    def _consume(self, text: str) -> None:
        # end-of-line = ( cr lf / cr / lf ).  A CR ends its line at once; an LF
        # right after a CR (even in the next read) is the rest of that CRLF and
        # is skipped.  Only the new text is scanned and an unfinished line is
        # kept as parts, so feeding a big event byte by byte stays linear.
        start = 0
        length = len(text)
        if self._after_cr and length:
            self._after_cr = False
            if text[0] == LF:
                start = 1
        cr = lf = -2  # next CR / LF at or after start; -1: none left (cached: linear scan)
        while start < length:
            if cr != -1 and cr < start:
                cr = text.find(CR, start)
            if lf != -1 and lf < start:
                lf = text.find(LF, start)
            if cr == -1 and lf == -1:
                self._line_parts.append(text[start:])
                return
            end = lf if cr == -1 or (lf != -1 and lf < cr) else cr
            self._line_parts.append(text[start:end])
            line = "".join(self._line_parts)
            self._line_parts = []
            self._process_line(line)
            if end == cr:
                if end + 1 == length:
                    self._after_cr = True
                    return
                start = end + 2 if text[end + 1] == LF else end + 1
            else:
                start = end + 1

    def _process_line(self, line: str) -> None:
        if line == "":
            self._dispatch()
            return
        if line.startswith(":"):
            self.comments.append(line[1:])  # ignored by the standard; recorded for tests
            return
        colon = line.find(":")
        if colon != -1:
            field, value = line[:colon], line[colon + 1:]
            if value.startswith(" "):
                value = value[1:]  # only the first space after the colon
        else:
            field, value = line, ""
        self._process_field(field, value)

    def _process_field(self, field: str, value: str) -> None:
        # Field names are compared literally (case-sensitive); unknown ones ignored.
        if field == "event":
            self._event_type = value
        elif field == "data":
            self._data += value + LF
        elif field == "id":
            if "\x00" not in value:
                self._last_event_id_buffer = value
        elif field == "retry" and value and all("0" <= ch <= "9" for ch in value):
            self.reconnection_time = int(value)

    def _dispatch(self) -> None:
        # 1. The last event ID string is set even if nothing is dispatched.
        self.last_event_id = self._last_event_id_buffer
        # 2. An empty data buffer dispatches nothing and resets both buffers.
        if self._data == "":
            self._event_type = ""
            return
        # 3. Remove one trailing LF.
        data = self._data[:-1] if self._data.endswith(LF) else self._data
        # 4-6. Type defaults to "message"; then reset the data and type buffers.
        self.events.append(SseEvent(self._event_type or "message", data, self.last_event_id))
        self._data = ""
        self._event_type = ""


def parse(stream: bytes, *, piece: Optional[int] = None) -> SpecParser:
    """Parse a whole stream (in ``piece``-byte reads if given); return the closed parser."""
    parser = SpecParser()
    if piece is None:
        parser.feed(stream)
    else:
        for i in range(0, len(stream), piece):
            parser.feed(stream[i:i + piece])
    parser.close()
    return parser


def parse_pieces(pieces: Iterable[bytes]) -> SpecParser:
    """Parse a stream delivered as the given byte slices; return the closed parser."""
    parser = SpecParser()
    for p in pieces:
        parser.feed(p)
    parser.close()
    return parser
