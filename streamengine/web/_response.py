"""One stream's response iterable: engine events in, batched SSE bytes out, ``close()`` cancels.

Why it is built this way:

* **One socket write per batch.**  The engine is driven by the server's
  thread iterating this response, and hands events over in lists
  (``Run.batches`` of ``StreamingEngine.run``): each list is what was ready before the
  run would wait (everything one read of the provider produced, a tool's
  result).  Writing a frame per token costs a server write call and a send
  syscall per token; joining a list's frames costs one of each, and since a
  list ends where the run would wait, no token waits for the next one.  A
  batch is also sent when it reaches ``MAX_BATCH_BYTES``.
* **A disconnect must cancel the run.**  PEP 3333 servers call ``close()``
  when the client has gone away (or after the last frame); it closes the
  event generator, which shuts the provider's socket down, cancels the tools
  and ends the run's threads.  A server only *notices* a disconnect when a
  write fails, so ``: ping`` goes out every ``heartbeat_s`` while the run is
  silent; under waitress the ``waitress.client_disconnected`` probe is also
  polled a few times a second.
* **A reader that stays stuck is cancelled.**  The run goes only as fast as
  the server's writes, so a client that reads nothing stops the run from
  reading the provider (memory stays bounded by the socket buffers); but the
  run would still hold a provider connection and tools.  :class:`StuckReaders` watches every open stream: one
  whose last batch has been in the server's hands (a blocked socket write)
  for ``stuck_reader_timeout_s`` is cancelled, and its connection dropped.
* **Cancelling is not enough for a stuck reader.**  The server's thread is
  blocked in its write for as long as the client's kernel acknowledges
  zero-window probes, which is for ever: the thread and the client's stream
  slot would stay taken (seven addresses held every slot of a default
  ``serve``).  So the connection is reset (``SO_LINGER`` 0, then
  ``shutdown``) where the server shows its socket: waitress's channel (whose
  method the disconnect probe is) or ``gunicorn.socket``.  The blocked write
  then fails, the server closes the response, and the slot is released.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from .._cancel import CancelToken
from .._logs import component_logger
from .._messages import Message
from ._public_errors import PublicErrors
from ._sse import frames, one_by_one

#: A batch is written once it is this large, however many events are still waiting.
#: How often an idle stream asks the server whether its client is gone (waitress); one attribute read.
PROBE_S = 0.25

Probe = Callable[[], bool]
_monotonic = time.monotonic


class SseResponse:
    """The response iterable of one stream: batches out, and ``close()`` cancels the run.

    ``close()`` may come from the server after the last frame, after a failed
    write (the client went away), or from another thread while a batch is
    being produced; in the last case generator ``close()`` is not allowed, so
    the run is stopped through its cancel token, which works from any thread.
    """

    def __init__(self, engine: Any, messages: Sequence[Message], *, heartbeat_s: Optional[float],
                 disconnected: Optional[Probe] = None, on_close: Optional[Callable[[], None]] = None,
                 errors: Optional[PublicErrors] = None, logger: Any = None,
                 run_options: Optional[dict] = None, drop_connection: Optional[Callable[[], None]] = None) -> None:
        self.cancel = CancelToken()
        self._drop = drop_connection
        tick = heartbeat_s
        if disconnected is not None:
            tick = PROBE_S if heartbeat_s is None else min(heartbeat_s, PROBE_S)
        # run() checks the messages and the engine eagerly: a ConfigError here is still a 4xx/5xx.
        run = engine.run(messages, self.cancel, heartbeat_s=tick, **(run_options or {}))  # conversation_id
        # An engine of your own whose run() gives events only: one event a batch.
        batches = run.batches() if callable(getattr(run, "batches", None)) else one_by_one(run)
        self._batches = frames(batches, heartbeat_s, disconnected, errors)
        self._progress = _Progress()
        # A generator over the frames and the progress only, never the response: no reference cycle,
        # so a response dropped without close() frees its run at once.
        self._writes = _write_each(self._batches, self._progress)
        self._on_close = on_close
        self._log = logger if logger is not None else component_logger("streamengine.web.SseResponse")
        self._started = time.monotonic()

    @property
    def writing_since(self) -> Optional[float]:
        """Since when (monotonic) a batch is in the server's hands; None while none is."""
        return self._progress.writing_since

    def __iter__(self) -> Iterator[bytes]:
        return self._writes  # a generator: the server's next() per write calls no Python method

    def __next__(self) -> bytes:
        return next(self._writes)

    def give_up(self) -> None:
        """The client took nothing for too long: cancel the run and drop the connection (from any thread).

        The server's thread is blocked writing to that client, so the run's end
        could never be written; dropping the connection makes that write fail,
        and the server then closes this response.  Without ``drop_connection``
        (a server that does not show its socket) only the run is cancelled.
        """
        self.cancel.set()
        drop, self._drop = self._drop, None
        if drop is not None and not self._progress.closed:
            drop()

    def close(self) -> None:
        """End the run (if still going) and free everything it holds; idempotent."""
        progress = self._progress
        self._drop = None
        if progress.closed:
            return
        progress.closed = True
        progress.writing_since = None
        if not progress.finished:
            self._log.info("stream closed by the server after {} writes and {:.3f}s (client gone?); "
                           "cancelling the run", progress.sent, time.monotonic() - self._started)
            self.cancel.set()
        try:
            for generator in (self._writes, self._batches):  # the first closes the second, once started
                try:
                    generator.close()
                except ValueError:  # being iterated in another thread: the cancel token ends that run
                    pass
        finally:
            on_close, self._on_close = self._on_close, None  # it refers back to this response: no cycle left
            if on_close is not None:
                on_close()


class _Progress:
    """What one response's writes have got to; shared by the response and its generator of writes."""

    __slots__ = ("closed", "finished", "sent", "writing_since")

    def __init__(self) -> None:
        self.writing_since: Optional[float] = None  # a batch is in the server's hands since then
        self.sent = 0
        self.finished = False
        self.closed = False


def _write_each(batches: Iterator[bytes], progress: _Progress) -> Iterator[bytes]:
    """The batches, one per server write, with ``progress`` kept up to date."""
    if not progress.closed:
        for batch in batches:
            if progress.closed:
                break
            progress.sent += 1
            progress.writing_since = _monotonic()
            yield batch
            progress.writing_since = None
            if progress.closed:
                break
        else:
            progress.finished = True
            return
    # Closed, maybe from another thread while a batch was made: finish the generators here,
    # in the iterating thread, where closing them is allowed.
    batches.close()  # type: ignore[attr-defined]


class StuckReaders:
    """Cancels streams whose client has not taken a write for ``timeout_s`` (one watcher thread per app).

    The thread runs only while streams are open, checks every ``timeout_s / 4``
    and ends when the last stream closes, so an idle app holds no thread.
    """

    def __init__(self, timeout_s: Optional[float], logger: Any) -> None:
        self.timeout_s = timeout_s
        self._log = logger
        self._streams: set[SseResponse] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def add(self, response: SseResponse) -> None:
        if self.timeout_s is None:
            return
        with self._lock:
            self._streams.add(response)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="streamengine-stuck-readers", daemon=True)
                self._thread.start()

    def remove(self, response: SseResponse) -> None:
        with self._lock:
            self._streams.discard(response)
            if not self._streams:
                self._wake.set()

    def _watch(self) -> None:
        assert self.timeout_s is not None
        while True:
            self._wake.wait(self.timeout_s / 4)
            with self._lock:
                self._wake.clear()
                if not self._streams:
                    self._thread = None
                    return
                streams = list(self._streams)
            now = time.monotonic()
            for response in streams:
                since = response.writing_since
                if since is not None and now - since >= self.timeout_s and not response.cancel.is_set():
                    self._log.warning("a client read nothing for {:.1f}s; cancelling its run and closing its "
                                      "connection (stuck_reader_timeout_s={})", now - since, self.timeout_s)
                    response.give_up()


def connection_dropper(environ: dict) -> Optional[Callable[[], None]]:
    """A function resetting this request's connection from any thread, or None where the server hides it.

    gunicorn puts the client's socket in ``gunicorn.socket``; waitress's
    ``waitress.client_disconnected`` is a method of its channel, which holds
    the socket (``channel.socket``).
    """
    sock = environ.get("gunicorn.socket")
    if sock is None:
        channel = getattr(environ.get("waitress.client_disconnected"), "__self__", None)
        sock = getattr(channel, "socket", None)
    if not isinstance(sock, socket.socket):
        return None
    return lambda: _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Reset, not close: the unsent answer is dropped at once (a FIN would wait behind it for ever)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)  # wakes the server: its blocked write fails, its loop sees the hang-up
    except OSError:  # already closed by the server: nothing left to drop
        pass
