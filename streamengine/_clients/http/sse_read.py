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
  look complete), so it is dropped here (:meth:`SseFramer.discard_tail`);
* it keeps a leading UTF-8 byte order mark, which then sits in the first
  field name (``"\ufeffdata"``) and silently loses the first event; WHATWG
  says to ignore one, so it is stripped here, even when split across reads.

Each complete event is handed to sseclient-py with a ``\\n\\n`` terminator,
so its own splitter sees exactly one event per item.  No I/O here: the
caller supplies the reads (parsers do no I/O).
"""
from __future__ import annotations

import codecs
import itertools
import math
import re
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import sseclient

from ..._errors import StreamEngineError

MAX_EVENT_BYTES = 8 * 1024 * 1024
# lines x bytes of one event; bounds sseclient's quadratic joining of data lines.
MAX_EVENT_WORK = 8 * MAX_EVENT_BYTES

# An empty line ends an event.  A line ends with CRLF, CR or LF (CRLF is one
# ending), so an event ends with two line endings in a row.  Longer
# alternatives come first because the regex alternation is ordered.
_EVENT_END = re.compile(rb"\r\n\r\n|\r\n\r|\r\n\n|\r\r\n|\r\r|\n\r\n|\n\r|\n\n")
_LONGEST_END = 4
_BOM = codecs.BOM_UTF8
_MESSAGE = itertools.repeat("message")  # zip() takes only as many as there are values
#: ``_CR in data``: a byte's value, looked for with one memchr.  ``b"\r" in data`` means the same,
#: but bytes' ``in`` first tries its operand as an int and makes (and drops) a TypeError for a bytes one.
_CR = ord("\r")


class SseEventTooLarge(StreamEngineError, ValueError):
    """An SSE event exceeded the size or work limit; the caller maps it to its own error."""


class SseFramer:
    """Cut a byte stream into complete SSE events (bytes, terminator stripped)."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES, max_event_work: int = MAX_EVENT_WORK) -> None:
        self.max_event_bytes = max_event_bytes
        self.max_event_work = max_event_work
        self._buf = bytearray()
        self.dropped_bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._undecoded = False  # the decoder holds the start of a character
        self._plain = False  # none held (head, character, event), no CR seen: feed_fields may split at once
        self._has_cr = False  # a CR was seen: take the general (regex) path from now on
        # The first bytes of the stream, held until they show whether they are a BOM.
        self._head: Optional[bytes] = b""
        # Events up to this size cannot exceed the work limit (lines <= bytes + 1).
        self._small = max(0, math.isqrt(max_event_work) - 1)

    def _feed_lf(self, data: bytes) -> List[bytes]:
        # Only LF line endings so far (what providers send): the one event end
        # possible is "\n\n", and bytes.split finds every one in C.
        buf = self._buf
        if buf:
            if b"\n\n" not in data and not (data[:1] == b"\n" and buf[-1:] == b"\n"):
                buf += data  # still inside one (big) event: amortised, never quadratic
                self._check_open_event()
                return []
            data = bytes(buf) + data
        events = data.split(b"\n\n")
        rest = events.pop()
        self._buf = bytearray(rest)
        if events and max(map(len, events)) > self._small:
            try:
                events = [self._checked(event) for event in events]
            except SseEventTooLarge:
                self._buf.clear()
                raise
        self._check_open_event()
        return events

    def feed_fields(self, data: bytes) -> List[Tuple[str, str]]:
        """Add one read; return ``(event name, data)`` of each event it completed, in order.

        The same result as :func:`event_fields` of the events, faster on what
        providers send.  A read of whole one-line ``data: `` events (every
        read of a paced stream), valid UTF-8, with nothing held from before,
        is split at once (:func:`_data_values`).  One-line events are under
        the work limit, and nothing is left for the buffer.  Anything else
        takes :meth:`_feed_held`.
        """
        if self._plain and data.endswith(b"\n\n") and _CR not in data:
            try:
                values = _data_values(data[:-2].decode())
            except UnicodeDecodeError:  # the replacing decoder's
                values = None
            if values is not None:
                return list(zip(_MESSAGE, values))
        return self._feed_held(data)

    def _feed_held(self, data: bytes) -> List[Tuple[str, str]]:
        """A read with something held (the stream's head, a character's start, an event) or unusual bytes."""
        if self._head is not None:
            data = self._without_bom(data)
        if self._undecoded or not data.isascii():
            data = self._sanitize(data, final=False)
        try:
            return self._feed_lf_fields(data)
        finally:
            self._plain = self._head is None and not (self._undecoded or self._has_cr or self._buf)

    def _feed_lf_fields(self, data: bytes) -> List[Tuple[str, str]]:
        """The general path of a sanitized read.

        LF-only input is cut after its last ``"\n\n"``, decoded once (it is
        valid UTF-8 after ``_sanitize``, and ``"\n\n"`` never splits a
        character), split into events, and each single ``data: `` line is
        taken by a list comprehension; any other event goes through
        :func:`event_fields`.  Runs of three or more newlines at the cut, CRs,
        and a terminator split across reads take the general path.
        """
        buf = self._buf
        complete, sep, rest = data.rpartition(b"\n\n")
        if (b"\r" in data or self._has_cr or complete[-1:] == b"\n"
                or (buf and data[:1] == b"\n" and buf[-1:] == b"\n")):
            return event_fields(self._feed_sanitized(data))
        if not sep:
            buf += data  # still inside one event: amortised, never quadratic
            self._check_open_event()
            return []
        if buf:
            complete = bytes(buf) + complete
        self._buf = bytearray(rest)
        self._check_open_event()
        text = complete.decode("utf-8")
        values = _data_values(text)
        if values is not None:  # one-line events are under the work limit
            return list(zip(_MESSAGE, values))
        texts = text.split("\n\n")
        if len(complete) > self._small and max(map(len, texts)) > self._small // 4:
            try:  # some event may be over the work limit (4 bytes a character at most)
                for text in texts:
                    self._checked(text.encode("utf-8"))
            except SseEventTooLarge:
                self._buf.clear()
                raise
        # List[Any]: it may hold a None until the test below; a cast() would cost a call per read.
        fields: List[Any] = [("message", t[6:]) if t[:6] == "data: " and "\n" not in t else None for t in texts]
        if None in fields:
            return _fields_slow(texts, fields)
        return fields

    def _feed_sanitized(self, data: bytes) -> List[bytes]:
        if b"\r" in data or self._has_cr:
            return self._feed_any(data)
        return self._feed_lf(data)

    def _feed_any(self, data: bytes) -> List[bytes]:
        """Any of the line endings SSE allows (CR, LF, CRLF, split across reads)."""
        self._has_cr = True
        scan_from = max(0, len(self._buf) - (_LONGEST_END - 1))
        self._buf += data
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
        self._check_open_event()
        return events

    def _check_open_event(self) -> None:
        if len(self._buf) > self.max_event_bytes:
            size = len(self._buf)
            self._buf.clear()
            raise SseEventTooLarge(
                f"an SSE event grew past {self.max_event_bytes} bytes ({size} bytes without "
                f"an empty line); the provider is not sending SSE events one by one"
            )

    def _without_bom(self, data: bytes) -> bytes:
        """The stream's first bytes without a leading BOM; held back while too few to tell."""
        head = (self._head or b"") + data
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._head = head
            return b""
        self._head = None
        return head[len(_BOM):] if head.startswith(_BOM) else head

    def discard_tail(self) -> int:
        """The body ended: drop an event without its terminating empty line; return its size.

        This is the WHATWG rule ("if the file ends in the middle of an event,
        before the final empty line, the incomplete event is not dispatched"),
        and here it is a safety rule too: sseclient-py would deliver such a
        trailing event, but a body cut right after ``data: {...finish_reason:
        "stop"}\n`` or ``data: [DONE]\n`` is a cut body, and must not turn a
        broken stream into a "complete" answer.  The size (also kept in
        ``dropped_bytes``) is for the caller's error message.
        """
        self._buf += (self._head or b"") + (self._sanitize(b"", final=True) if self._undecoded else b"")
        self._head = None
        tail, self._buf = bytes(self._buf), bytearray()
        self.dropped_bytes = len(tail.strip())
        return self.dropped_bytes

    def _sanitize(self, data: bytes, final: bool) -> bytes:
        """``data`` through the replacing decoder; needed only while it holds bytes, or for non-ASCII."""
        text = self._decoder.decode(data, final)
        self._undecoded = bool(self._decoder.getstate()[0])  # a character split across reads
        return text.encode("utf-8")

    def _checked(self, event: bytes) -> bytes:
        lines = event.count(b"\n") + event.count(b"\r") + 1
        if lines > 1 and lines * len(event) > self.max_event_work:
            raise SseEventTooLarge(
                f"an SSE event of {len(event)} bytes in {lines} lines is over the parser's "
                f"work limit ({self.max_event_work} line-bytes); send one data line per event"
            )
        return event


#: The event name of a pause in the events: ``(WAIT, wait)`` stands where the reads would block,
#: and a parser yields ``wait`` on (compared by identity: no event is named this object).
WAIT = "\x00wait"


def iter_event_batches(reads: Iterable[Any], framer: SseFramer) -> Iterator[List[Tuple[str, Any]]]:
    """``(event name, data)`` of the events each read completed, one list per read.

    The hot path of a stream: one generator step per read, not per event.  A
    read that is not bytes is a wait (``_clients.base.Wait``): it passes as
    the one pair ``(WAIT, wait)``.  When the reads end, an unfinished last
    event is dropped (see :meth:`SseFramer.discard_tail`; its size is in
    ``framer.dropped_bytes``).  A body read from its socket frames its
    reads itself (``body.SocketBody.event_batches``, the same lists).
    """
    feed = framer.feed_fields
    last_wait: Any = None
    paused: List[Tuple[str, Any]] = []
    for data in reads:
        if data.__class__ is bytes:
            fields = feed(data)
            if fields:
                yield fields
        else:
            if data is not last_wait:  # a body waits on one object: one list for all its pauses
                last_wait, paused = data, [(WAIT, data)]
            yield paused
    framer.discard_tail()


def event_fields(events: List[bytes]) -> List[Tuple[str, str]]:
    """``(event name, data)`` per complete event; events without data are dropped.

    A single ``data:`` line (what OpenAI-style providers send), or an
    ``event:`` line followed by one ``data:`` line (what Anthropic sends), is
    read here directly; anything else (comments, several lines, CRs) goes
    through sseclient-py, so both give the same result.
    """
    out: List[Tuple[str, str]] = []
    append = out.append
    for raw in events:
        if raw[:5] == b"data:" and b"\n" not in raw and b"\r" not in raw:
            append(("message", _value(raw, 5).decode("utf-8")))
        elif raw[:6] == b"event:" and raw.count(b"\n") == 1 and b"\r" not in raw \
                and raw.partition(b"\n")[2][:5] == b"data:":
            head, _, body = raw.partition(b"\n")
            append((_value(head, 6).decode("utf-8") or "message", _value(body, 5).decode("utf-8")))
        elif raw:
            event = _parsed(raw)
            if event is not None:
                append((event.event, event.data))
    return out


def _value(line: bytes, start: int) -> bytes:
    """A field's value: what follows ``name:``, less one leading space (as the SSE spec says)."""
    return line[start + 1:] if line[start:start + 1] == b" " else line[start:]


def _data_values(text: str) -> Optional[List[str]]:
    """The data of each event in ``text`` (LF-only, cut at event ends) if each is one ``data: `` line; else None.

    One split in C at the event ends (``"\n\ndata: "``) gives every value;
    the text is such events only if no value holds a newline.  Each ``in``
    is a ``memchr``: cheaper than counting the text's newlines, which reads
    every character in a loop of its own.
    """
    if text[:6] != "data: ":
        return None
    values = text[6:].split("\n\ndata: ")
    for value in values:
        if "\n" in value:
            return None
    return values


def _fields_slow(texts: List[str], fields: List[Optional[Tuple[str, str]]]) -> List[Tuple[str, str]]:
    """Fill in the events the fast path left out (comments, names, several lines, "data:x")."""
    out = []
    for text, field in zip(texts, fields):
        if field is not None:
            out.append(field)
        elif text[:7] == "event: " and text.count("\n") == 1 and text[7:8] not in ("", "\n") \
                and text.partition("\n")[2][:6] == "data: ":
            head, _, body = text.partition("\n")  # Anthropic's "event: X" + "data: {...}", read directly
            out.append((head[7:], body[6:]))
        elif text:
            out.extend(event_fields([text.encode("utf-8")]))
    return out


def _parsed(raw: bytes) -> Optional[sseclient.Event]:
    for event in sseclient.SSEClient(iter([raw + b"\n\n"])).events():
        return event
    return None


def read1_iter(read1: Callable[[int], bytes], size: int = 65536) -> Iterator[bytes]:
    """Yield ``read1(size)`` results until one is empty (the body ended)."""
    while True:
        data = read1(size)
        if not data:
            return
        yield data
