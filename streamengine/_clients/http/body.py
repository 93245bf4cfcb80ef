"""Reading an HTTP response body as it arrives, boundedly, and giving the connection back.

The body is read with ``read1``: it returns whatever has arrived, on chunked,
close-delimited and Content-Length bodies alike, where
``requests.Response.iter_content(n)`` would wait to fill ``n`` bytes.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Union

import requests
import urllib3.exceptions

from ..._errors import LlmProtocolError
from ..._logs import redact_url
from ..._wait import Wait, readable
from .connection import RequestTracker
from .sse_read import WAIT, SseFramer, read1_iter

READ_SIZE = 65536
#: What reading or sending may raise underneath requests: all become streamengine errors.
STREAM_ERRORS = (
    requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
)


def cancelled(cancel: Optional[threading.Event], tracker: RequestTracker) -> bool:
    return tracker.aborted or (cancel is not None and cancel.is_set())


def read1_of(resp: requests.Response) -> Callable[[int], bytes]:
    """``read1`` of the body: returns what has arrived instead of waiting to fill a buffer.

    urllib3 >= 2 has it (decoding any content encoding); on urllib3 1.x the
    http.client response underneath has it (we ask for no encoding).
    """
    raw = resp.raw
    if hasattr(raw, "read1"):
        return lambda n: raw.read1(n, decode_content=True)
    fp = getattr(raw, "_fp", None)
    reader: Callable[[int], bytes] = fp.read1 if fp is not None and hasattr(fp, "read1") else raw.read
    return reader  # raw.read is the last resort: correct, but may wait for a full buffer


#: After ``[DONE]``, how long to wait for the rest of the body (a chunked body's
#: ``0\r\n\r\n``) so the connection can be reused.  It is nearly always there
#: already; a provider that holds the body open after [DONE] costs this once,
#: and its connection is closed instead of reused.
DRAIN_AFTER_DONE_S = 0.05
DRAIN_AFTER_DONE_BYTES = 64 * 1024


def drain_after_done(resp: requests.Response, tracker: RequestTracker) -> bool:
    """Read what follows ``[DONE]`` (briefly, boundedly) so urllib3 can pool the connection.

    Closing a chunked response before its terminating chunk closes the
    connection: every streamed call would pay a new TCP (and TLS) handshake.
    Returns True when the body ended and the connection went back to the pool.
    """
    tracker.set_read_timeout(DRAIN_AFTER_DONE_S)
    read1 = read1_of(resp)
    drained = 0
    try:
        while drained <= DRAIN_AFTER_DONE_BYTES:
            data = read1(READ_SIZE)
            if not data:
                return True
            drained += len(data)
    except STREAM_ERRORS:
        pass  # timed out or broke after [DONE]: the answer is complete; the connection is closed
    return False


def excerpt(resp: requests.Response, limit: int = 300) -> str:
    """The start of a body for an error message; unreadable is not a second error."""
    try:
        return read_limited(resp, limit, truncate=True).decode("utf-8", errors="replace")
    except STREAM_ERRORS as exc:
        return f"<body unreadable: {exc}>"


def read_limited(resp: requests.Response, limit: int, truncate: bool) -> bytes:
    """Read the body up to ``limit`` bytes; over it, cut (``truncate``) or refuse."""
    parts: List[bytes] = []
    size = 0
    for data in read1_iter(read1_of(resp), READ_SIZE):
        parts.append(data)
        size += len(data)
        if size > limit:
            if truncate:
                break
            raise LlmProtocolError(
                f"the answer from {redact_url(resp.url)} is over {limit} bytes; refusing to buffer it"
            )
    return b"".join(parts)[:limit]


# ----------------------------------------------------------------------------- the socket itself

#: A chunk-size line longer than this is not HTTP (http.client allows 64 KiB lines; sizes are a few bytes).
_MAX_SIZE_LINE = 4096
_NEVER = float("inf")


def _as_is(data: bytes) -> bytes:
    return data


class SocketBody:
    """A streamed body read from its socket without blocking: bytes, or a :class:`Wait` where it would block.

    requests and urllib3 still make the connection (pool, TLS, proxies) and
    read the headers; from then on the body is taken from the socket here:
    first what urllib3/http.client already buffered, then ``recv`` on the
    socket made non-blocking, ``SSLSocket.pending()`` bytes before any wait.
    Chunked framing is decoded once per read (not once per HTTP chunk through
    ``readline``), and nothing here ever blocks: a read that finds nothing
    yields the body's one :class:`Wait` on the socket.  :meth:`of` says None
    when the body cannot be read this way (content encoding, a socket that is
    not a socket); the caller then reads through urllib3.
    """

    def __init__(self, resp: requests.Response, sock: Any, head: bytes, chunked: bool,
                 length: Optional[int]) -> None:
        self._resp = resp
        self._sock = sock
        self._head = head
        self._chunked = chunked
        self._length = length  # bytes left of a Content-Length body; None: chunked or until close
        self._saved_timeout = sock.gettimeout()
        self._pending = getattr(sock, "pending", None)  # TLS: decrypted bytes the socket already holds
        self.wait = Wait(sock)
        self.ended = False  # the body's end was read (terminator, length, or close)
        self.extra = False  # bytes came after the body's end: the connection cannot be reused
        # chunked state: bytes left in the current chunk, the CRLF after it, the size line so far, trailers
        self._left = 0
        self._skip = 0
        self._line = b""
        self._trailers = False
        sock.setblocking(False)

    @classmethod
    def of(cls, resp: requests.Response) -> Optional[SocketBody]:
        """The socket reader for ``resp``, or None when urllib3 must read it (see the class doc)."""
        raw = resp.raw
        inner = getattr(raw, "_fp", None)
        fp = getattr(inner, "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if (sock is None or not isinstance(sock, socket.socket) or encoding not in ("", "identity")
                or getattr(inner, "chunk_left", None) is not None or len(getattr(raw, "_decoded_buffer", b"")) > 0):
            return None
        chunked = bool(getattr(inner, "chunked", False))
        length = None if chunked else getattr(inner, "length", None)
        body = cls(resp, sock, b"", chunked, length)
        body._head = body._buffered(fp)
        return body

    def _buffered(self, fp: Any) -> bytes:
        """What the headers' reader already holds of the body (it read ahead), without waiting."""
        try:
            held = fp.peek()
            return fp.read(len(held)) if held else b""
        except (BlockingIOError, ssl.SSLWantReadError):
            return b""

    def reads(self, size: int = READ_SIZE) -> Iterator[Union[bytes, Wait]]:
        """The body's bytes as they arrive; a :class:`Wait` on the socket whenever none are there."""
        return self._pulled(_as_is, self.wait, None, size)

    def event_batches(self, framer: SseFramer, size: int = READ_SIZE) -> Iterator[List[Any]]:
        """``sse_read.iter_event_batches`` of :meth:`reads`, framed in the read loop itself (one generator step
        a read, not two): the same lists, ``[(WAIT, wait)]`` where it would block."""
        return self._pulled(framer.feed_fields, [(WAIT, self.wait)], framer.discard_tail, size)

    def _pulled(self, feed: Callable[[bytes], Any], paused: Any, at_end: Optional[Callable[[], Any]],
                size: int) -> Iterator[Any]:
        """Each read's payload through ``feed`` (what it gives, when not empty); ``paused`` where it would block.

        The read loop of :meth:`reads` and :meth:`event_batches`; ``at_end`` runs at the body's clean end.
        """
        raw, self._head = self._head, b""  # first what the headers' reader held
        decode = self._dechunk if self._chunked else self._decode
        wait, pending, recv = self.wait, self._pending, self._sock.recv
        while True:
            out = feed(decode(raw)) if raw else None
            if out:
                yield out
            if self.ended:
                break
            if pending is None or not pending():
                wait.until = _NEVER
                yield paused
            try:
                raw = recv(size)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                raw = b""  # readable was a partial TLS record, or spurious: wait again
                continue
            if not raw:
                self._eof()
                break
        if at_end is not None:
            at_end()

    def _eof(self) -> None:
        if self._chunked or (self._length is not None and self._length > 0):
            raise http.client.IncompleteRead(b"", self._length if self._length else None)
        self.ended = True

    def _decode(self, raw: bytes) -> bytes:
        """A body that is not chunked: up to its Content-Length, if it has one."""
        if self._length is None:
            return raw
        take = raw[:self._length]
        self._length -= len(take)
        if self._length == 0:
            self.ended = True
            self.extra = len(raw) > len(take)
        return take

    def _dechunk(self, raw: bytes) -> bytes:
        """Payload of the chunked bytes ``raw``; as lenient as http.client (LF line ends, CRLF not checked).

        At a chunk's start, whole chunks (a paced stream's every read is one) are taken in one pass
        (:meth:`_whole_chunks`); the rest goes step by step.  A read that is exactly one whole chunk (every read
        of a paced stream) is sliced at once: the same bytes, in a third of the work.
        """
        if not (self._left or self._skip or self._line or self._trailers or self.ended):
            newline = raw.find(b"\n")
            if newline > 0:
                try:
                    size = int(raw[:newline], 16)
                except ValueError:
                    size = 0
                if size > 0 and newline + size + 3 == len(raw):
                    return raw[newline + 1:-2]
        out: List[bytes] = []
        pos, end = 0, len(raw)
        while pos < end:
            if self.ended:
                self.extra = True
                break
            if not (self._left or self._skip or self._line or self._trailers):
                pos = self._whole_chunks(raw, pos, out)
                if pos == end:
                    break
            pos = self._step(raw, pos, out)
        return b"".join(out) if len(out) != 1 else out[0]

    @staticmethod
    def _whole_chunks(raw: bytes, pos: int, out: List[bytes]) -> int:
        """From ``pos``, a chunk's start: the data of each whole chunk (plain size line, data, 2 bytes) to ``out``.

        Returns where they stop: a chunk cut by the read, an extension, the last chunk or garbage is :meth:`_step`'s.
        """
        last = len(raw) - 2  # where the two bytes after the last whole chunk's data can start
        find, append = raw.find, out.append
        while pos < last:  # past it, no chunk can be whole: no search for a size line that cannot be there
            newline = find(b"\n", pos)
            if newline < 0:
                return pos
            try:
                size = int(raw[pos:newline], 16)
            except ValueError:
                return pos
            stop = newline + 1 + size
            if size <= 0 or stop > last:
                return pos
            append(raw[newline + 1:stop])
            pos = stop + 2
        return pos

    def _step(self, raw: bytes, pos: int, out: List[bytes]) -> int:
        """One step through the chunked framing from ``pos``: data, the CRLF after it, or a size line."""
        if self._left:
            piece = raw[pos:pos + self._left]
            out.append(piece)
            self._left -= len(piece)
            if not self._left:
                self._skip = 2
            return pos + len(piece)
        if self._skip:
            skipped = min(self._skip, len(raw) - pos)
            self._skip -= skipped
            return pos + skipped
        newline = raw.find(b"\n", pos)
        if newline < 0:
            self._line += raw[pos:]
            if len(self._line) > _MAX_SIZE_LINE:
                raise http.client.LineTooLong("chunk size line")
            return len(raw)
        line, self._line = self._line + raw[pos:newline], b""
        self._size_line(line)
        return newline + 1

    def _size_line(self, line: bytes) -> None:
        if self._trailers:
            if not line.strip():
                self.ended = True
            return
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError as exc:
            raise http.client.IncompleteRead(b"") from exc
        if size < 0:
            raise http.client.IncompleteRead(b"")
        if size == 0:
            self._trailers = True
        self._left = size

    def finish(self, tracker: RequestTracker) -> bool:
        """After the stream's end marker: read the rest of the body briefly, and pool the connection if clean."""
        deadline = time.monotonic() + DRAIN_AFTER_DONE_S
        drained = 0
        try:
            for item in self.reads():
                if item.__class__ is Wait:
                    left = deadline - time.monotonic()
                    if left <= 0 or not readable(self._sock, left):
                        return False
                    continue
                drained += len(item)  # type: ignore[arg-type]
                if drained > DRAIN_AFTER_DONE_BYTES:
                    return False
        except STREAM_ERRORS:
            return False
        if self.extra or self._head:
            return False
        return self._release(tracker)

    def _release(self, tracker: RequestTracker) -> bool:
        """The body was read to its end: hand the connection back as urllib3 would have."""
        self.close()
        raw = self._resp.raw
        inner = getattr(raw, "_fp", None)
        if inner is None or getattr(inner, "will_close", True):
            return False
        try:
            inner._close_conn()  # http.client's own end of a body: the socket stays with the connection
            raw.release_conn()
        except Exception:
            return False
        return True

    def close(self) -> None:
        """Give the socket its blocking mode back (it may return to the pool)."""
        try:
            self._sock.settimeout(self._saved_timeout)
        except OSError:
            pass  # closed or shut down: nothing to restore


def ALWAYS() -> bool:
    """A wait's ``ready`` that is over at once: it only passes up to be filled in with deadlines."""
    return True


def seconds_left(wait: Wait) -> Optional[float]:
    """Time until the wait's deadline, as a socket timeout (None: no deadline)."""
    due = wait.due()
    if due == _NEVER:
        return None
    return max(0.001, due - time.monotonic())


def timed_reads(resp: requests.Response, tracker: RequestTracker) -> Iterator[Union[bytes, Wait]]:
    """A body urllib3 must read (see ``SocketBody.of``): blocking reads, each bounded by the call's deadline.

    Before each read a wait that is over at once passes up, so the strategy
    fills in its deadlines; the read's socket timeout is what is left of them.
    """
    read1 = read1_of(resp)
    wait = Wait(None, ready=ALWAYS)
    while True:
        wait.until = _NEVER
        yield wait
        tracker.set_read_timeout(seconds_left(wait))
        data = read1(READ_SIZE)
        if not data:
            return
        yield data
