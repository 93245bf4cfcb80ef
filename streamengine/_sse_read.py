"""Turn raw body reads into SSE events, safely, for sseclient-py.

sseclient-py parses the fields of an event well (comments, ``event:``,
multi-line ``data:``), but four of its habits are unsafe on a provider's
bytes, so this module stands between the socket and it:

* it decodes each line as strict UTF-8 and raises ``UnicodeDecodeError``:
  the whole byte stream is first passed through one incremental decoder with
  ``errors="replace"`` (a character split across reads is joined, an invalid
  byte becomes U+FFFD) and re-encoded;
* it buffers an event by ``bytes +=`` per line with no limit, quadratic and
  unbounded: events are cut here, linearly, and an event over
  ``max_event_bytes`` is refused;
* it joins ``data:`` lines by repeated ``str +=``, quadratic in the number of
  lines: an event whose lines x bytes exceed a work budget is refused too.
  Providers send one ``data:`` line per event, so only garbage trips it.
* it delivers a trailing event that lacks its empty line when the body
  ends; WHATWG says to drop it, and so does safety (a cut body must never
  look complete), so it is dropped here (:meth:`SseFramer.finish`).

Each complete event is handed to sseclient-py with a ``\\n\\n`` terminator,
so its own splitter sees exactly one event per item.  No I/O here: the
caller supplies the reads (parsers do no I/O).
"""
from __future__ import annotations

import codecs
import re
from typing import Callable, Iterable, Iterator, List

import sseclient

MAX_EVENT_BYTES = 8 * 1024 * 1024
# lines x bytes of one event; bounds sseclient's quadratic joining of data lines.
MAX_EVENT_WORK = 8 * MAX_EVENT_BYTES

# An empty line ends an event.  A line ends with CRLF, CR or LF (CRLF is one
# ending), so an event ends with two line endings in a row.  Longer
# alternatives come first because the regex alternation is ordered.
_EVENT_END = re.compile(rb"\r\n\r\n|\r\n\r|\r\n\n|\r\r\n|\r\r|\n\r\n|\n\r|\n\n")
_LONGEST_END = 4


class SseEventTooLarge(ValueError):
    """An SSE event exceeded the size or work limit; the caller maps it to its own error."""


class SseFramer:
    """Cut a byte stream into complete SSE events (bytes, terminator stripped)."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES, max_event_work: int = MAX_EVENT_WORK) -> None:
        self.max_event_bytes = max_event_bytes
        self.max_event_work = max_event_work
        self._buf = bytearray()
        self.dropped_bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> List[bytes]:
        """Add one read; return the events it completed, in order."""
        scan_from = max(0, len(self._buf) - (_LONGEST_END - 1))
        self._buf += self._sanitize(data, final=False)
        events: List[bytes] = []
        start = 0
        try:
            for match in _EVENT_END.finditer(self._buf, scan_from):
                events.append(self._checked(bytes(self._buf[start:match.start()])))
                start = match.end()
        except SseEventTooLarge:
            self._buf.clear()  # the stream is unusable now; do not hold its bytes
            raise
        if start:
            del self._buf[:start]
        if len(self._buf) > self.max_event_bytes:
            size = len(self._buf)
            self._buf.clear()
            raise SseEventTooLarge(
                f"an SSE event grew past {self.max_event_bytes} bytes ({size} bytes without "
                f"an empty line); the provider is not sending SSE events one by one"
            )
        return events

    def finish(self) -> List[bytes]:
        """The body ended: an event without its terminating empty line is dropped.

        This is the WHATWG rule ("if the file ends in the middle of an event,
        before the final empty line, the incomplete event is not dispatched"),
        and here it is a safety rule too: sseclient-py would deliver such a
        trailing event, but a body cut right after ``data: {...finish_reason:
        "stop"}\n`` or ``data: [DONE]\n`` is a cut body, and must not turn a
        broken stream into a "complete" answer.  ``dropped_bytes`` says how
        much was dropped, for the caller's error message.  Always returns
        ``[]``; it is a list so that callers need not special-case it.
        """
        self._buf += self._sanitize(b"", final=True)
        tail, self._buf = bytes(self._buf), bytearray()
        self.dropped_bytes = len(tail.strip())
        return []

    def _sanitize(self, data: bytes, final: bool) -> bytes:
        if not self._decoder.getstate()[0] and data.isascii():
            return data  # the common case needs no round trip
        return self._decoder.decode(data, final).encode("utf-8")

    def _checked(self, event: bytes) -> bytes:
        lines = event.count(b"\n") + event.count(b"\r") + 1
        if lines > 1 and lines * len(event) > self.max_event_work:
            raise SseEventTooLarge(
                f"an SSE event of {len(event)} bytes in {lines} lines is over the parser's "
                f"work limit ({self.max_event_work} line-bytes); send one data line per event"
            )
        return event


def iter_events(reads: Iterable[bytes], framer: SseFramer) -> Iterator["sseclient.Event"]:
    """SSE events (sseclient-py ``Event`` objects) from an iterable of raw reads."""
    return sseclient.SSEClient(_framed(reads, framer)).events()


def _framed(reads: Iterable[bytes], framer: SseFramer) -> Iterator[bytes]:
    for data in reads:
        for event in framer.feed(data):
            if event:
                yield event + b"\n\n"
    for event in framer.finish():
        yield event + b"\n\n"


def read1_iter(read1: Callable[[int], bytes], size: int = 65536) -> Iterator[bytes]:
    """Yield ``read1(size)`` results until one is empty (the body ended)."""
    while True:
        data = read1(size)
        if not data:
            return
        yield data
