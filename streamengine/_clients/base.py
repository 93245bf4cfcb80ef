"""What the call strategies need from a provider client, and nothing more.

A client knows the wire format and the connection; it knows nothing of idle
timeouts or failover (those live in ``_calls``).

**Waits instead of blocking reads.**  A run is driven by the thread that
iterates it (the WSGI server's thread, the script's thread), so nothing below
the run may block in a read: a tool result, a cancel or a deadline must be
able to come first.  A client that can say so yields a :class:`Wait` among
its chunks (from :meth:`StreamingLlmClient.open_stream`) wherever it would
otherwise block: "resume me when this socket is readable, or at ``until``".
The layers above tighten the wait (idle timer, cap), the run's one selector
waits for it together with the run's wake-up pipe, and :func:`run_blocking`
does the same wait right there for a caller that drives a call by itself.
``stream()`` stays chunks only, for every caller that iterates it directly.
"""
from __future__ import annotations

import abc
import select
import threading
import time
from typing import Any, Callable, Generator, Iterator, Optional, Sequence, TypeVar, Union

from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec

_NEVER = float("inf")
#: A wait without a socket to watch wakes at least this often to look again (a lost wake-up costs this).
WAIT_SLICE_S = 0.05
T = TypeVar("T")


class Wait:
    """A point where a stream would block: resume it when ``fileobj`` is readable or at a deadline.

    Filled in by the layers it passes through, on the way up and back:

    * ``fileobj`` (a socket, or None: nothing to read, e.g. a tool being
      waited for) and ``until`` (monotonic; a hard deadline: a cap, the end of
      a scripted pause) come from the client or the strategy;
    * ``idle_until`` is the idle deadline, which the time the *consumer* held
      the thread does not use up: the driver adds that time to ``held``
      and waits until ``idle_until + held``;
    * ``ready()``, when given, says the wait is over already (a worker set a
      flag); ``waker`` is set by the driver to a callable that ends its wait
      at once, for whoever sets that flag from another thread;
    * ``readable`` is set by the driver when it resumes the stream because
      ``fileobj`` is readable and no deadline had passed (the strategy then
      skips its own deadline check: one clock read less a token); a driver
      that does not say leaves it False, and the strategy checks.
    """

    __slots__ = ("fileobj", "held", "idle_until", "readable", "ready", "until", "waker")

    def __init__(self, fileobj: Any = None, until: float = _NEVER,
                 ready: Optional[Callable[[], bool]] = None) -> None:
        self.fileobj = fileobj
        self.until = until
        self.idle_until = _NEVER
        self.held = 0.0
        self.ready = ready
        self.waker: Optional[Callable[[], None]] = None
        self.readable = False

    def due(self) -> float:
        """The monotonic time this wait ends by, if nothing wakes it first."""
        idle = self.idle_until + self.held
        return idle if idle < self.until else self.until

    def wake(self) -> None:
        """End the driver's wait now (from any thread); a flag checked by ``ready`` should be set first."""
        waker = self.waker
        if waker is not None:
            waker()


def _nobody() -> None:
    pass


class Flag:
    """An event another thread sets that also ends, at once, the driver's wait watching it.

    The waiter makes a :class:`Wait` whose ``ready`` is :attr:`is_set` and sets
    :attr:`wake` to that wait's ``wake``; :meth:`set` sets the event first, then
    wakes.  ``is_set`` and ``wait`` are the event's own methods: such a wait
    holds the event, not this flag (which holds the wait), so the two make no
    cycle for the garbage collector.
    """

    __slots__ = ("_event", "is_set", "wait", "wake")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.is_set: Callable[[], bool] = self._event.is_set
        self.wait: Callable[[Optional[float]], bool] = self._event.wait
        self.wake: Callable[[], None] = _nobody

    def set(self) -> None:
        self._event.set()
        self.wake()


class LlmClient(abc.ABC):
    """A provider that answers a conversation in one piece."""

    @abc.abstractmethod
    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None) -> Response:
        """Return the whole answer; setting ``cancel`` aborts the request at once."""

    def close(self) -> None:
        """Release pooled connections; the default holds none."""


class StreamingLlmClient(LlmClient):
    """A provider that can also stream its answer chunk by chunk."""

    #: True when :meth:`open_stream` yields :class:`Wait` items instead of blocking.  A client
    #: that blocks in its reads still works: its idle timer and cap are then kept by a watcher thread.
    yields_waits = False

    @abc.abstractmethod
    def stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
               options: Optional[CompletionOptions] = None,
               cancel: Optional[threading.Event] = None) -> Iterator[Chunk]:
        """Yield chunks as they arrive; the last one has ``is_completed=True``.

        Setting ``cancel`` (from any thread) must unblock a read in progress at
        once and end the iterator with :class:`LlmCancelledError`.  A stream
        that ends without completion raises :class:`LlmStreamError`.
        """

    def open_stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None,
                    cancel: Optional[threading.Event] = None) -> Iterator[Union[Chunk, Wait]]:
        """Chunks, and a :class:`Wait` wherever the stream would block (see :attr:`yields_waits`).

        The default is :meth:`stream`: chunks only, blocking reads.
        """
        return self.stream(messages, tools, options, cancel)


def chunks_only(items: Iterator[Union[Chunk, Wait]]) -> Iterator[Chunk]:
    """The chunks of ``items``, each :class:`Wait` waited out here (a blocking ``stream()``)."""
    try:
        for item in items:
            if item.__class__ is Wait:
                block_on(item)  # type: ignore[arg-type]
            else:
                yield item  # type: ignore[misc]
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def run_blocking(steps: Generator[Wait, None, T]) -> T:
    """Drive a generator of waits to its return value, waiting each one out in this thread."""
    try:
        wait = next(steps)
        while True:
            block_on(wait)
            wait = steps.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def block_on(wait: Wait) -> None:
    """Wait here until ``wait.fileobj`` is readable, ``wait.ready()`` or the wait's deadline."""
    ready = wait.ready
    due = wait.due()
    sock = wait.fileobj
    while True:
        if ready is not None and ready():
            return
        left = due - time.monotonic()
        if left <= 0:
            return
        if sock is None:
            time.sleep(min(left, WAIT_SLICE_S))
            continue
        if readable(sock, left if ready is None else min(left, WAIT_SLICE_S)):
            return


def readable(sock: Any, timeout: float) -> bool:
    """Whether ``sock`` becomes readable within ``timeout`` seconds (a shut-down socket is)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(min(timeout, 86400.0) * 1000))
    got, _, failed = select.select([sock], [], [sock], min(timeout, 86400.0))
    return bool(got or failed)
