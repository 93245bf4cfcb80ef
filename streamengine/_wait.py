"""The one waiting primitive: a :class:`Wait` is yielded where a generator would block.

1. A Wait is a point where a generator would block: a socket to read (``fileobj``) and/or a
   ``ready()`` check, until the nearest of ``until`` and ``idle_until + held``.
2. Whoever would block yields one (a client's read, a worker's hand-over, a tool, a back-off);
   every layer above passes it up (``yield from``), so the run never blocks below its driver.
3. Layers may only tighten it on the way up: the call strategy sets the cap (``until``) and the
   idle deadline (``idle_until``).
4. One driver blocks on it: the run's loop (``_engine.loop.RunLoop``: one poll with the run's
   wake-up pipe, adding the time the consumer held the thread to ``held``), or :func:`block_on`.
5. Another thread ends a wait early by changing what ``ready()`` reads first, then calling
   ``wait.wake()``: a :class:`Flag` does both.

A client that can only block in its reads is read on a worker thread (:func:`on_worker`) that
hands its items over and wakes the wait: to the layers above it looks like any other client.
"""
from __future__ import annotations

import select
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Generator, Iterator, Optional, TypeVar, Union

_NEVER = float("inf")
#: A blocking driver waiting for ``ready()`` without a socket looks again at least this often.
WAIT_SLICE_S = 0.05
#: Items a worker reads ahead of the run before it waits for the run to take them.
WORKER_AHEAD = 64
T = TypeVar("T")
R = TypeVar("R")


class Wait:
    """A point where a generator would block; see the module doc for who fills in what.

    ``waker`` is set by the driver: a callable that ends its wait at once,
    for whoever changes what ``ready`` reads from another thread.
    """

    __slots__ = ("fileobj", "held", "idle_until", "ready", "until", "waker")

    def __init__(self, fileobj: Any = None, until: float = _NEVER,
                 ready: Optional[Callable[[], bool]] = None) -> None:
        self.fileobj = fileobj
        self.until = until
        self.idle_until = _NEVER
        self.held = 0.0
        self.ready = ready
        self.waker: Optional[Callable[[], None]] = None

    def due(self) -> float:
        """The monotonic time this wait ends by, if nothing wakes it first."""
        idle = self.idle_until + self.held
        return idle if idle < self.until else self.until

    def wake(self) -> None:
        """End the driver's wait now (from any thread); change what ``ready`` reads first."""
        waker = self.waker
        if waker is not None:
            waker()


def at_once() -> bool:
    """``Wait(ready=at_once)``: a yield that hands what happened so far to the consumer, blocking nothing."""
    return True


def _nobody() -> None:
    pass


class Flag:
    """An event another thread sets that also ends, at once, the driver's wait watching it.

    The waiter makes a :class:`Wait` whose ``ready`` is :attr:`is_set` and sets
    :attr:`wake` to that wait's ``wake``; :meth:`set` sets the event, then wakes.
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


def block_on(wait: Wait) -> None:
    """Wait in this thread until ``wait.fileobj`` is readable, ``wait.ready()``, a wake, or the wait's deadline."""
    ready, sock, due = wait.ready, wait.fileobj, wait.due()
    woken = threading.Event()
    wait.waker = woken.set
    while True:
        if ready is not None and ready():
            return
        left = due - time.monotonic()
        if left <= 0:
            return
        if sock is None:
            if woken.wait(left if ready is None else min(left, WAIT_SLICE_S)):
                return  # woken: the generator looks again
        elif readable(sock, left if ready is None else min(left, WAIT_SLICE_S)):
            return


def drive(steps: Generator[Wait, None, R]) -> R:
    """Run a generator of waits to its return value, blocking on each wait in this thread."""
    try:
        wait = next(steps)
        while True:
            block_on(wait)
            wait = steps.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def chunks_only(items: Iterator[Union[T, Wait]]) -> Iterator[T]:
    """The items of ``items``, each :class:`Wait` blocked on here (a client's plain ``stream()``)."""
    try:
        for item in items:
            if isinstance(item, Wait):
                block_on(item)
            else:
                yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def readable(sock: Any, timeout: float) -> bool:
    """Whether ``sock`` becomes readable within ``timeout`` seconds (a shut-down socket is)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(min(timeout, 86400.0) * 1000))
    got, _, failed = select.select([sock], [], [sock], min(timeout, 86400.0))
    return bool(got or failed)


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


def on_worker(open_items: Callable[[], Iterator[T]], name: str, join_s: float, log: Any = None,
              cancel: Optional[threading.Event] = None) -> Iterator[Union[T, Wait]]:
    """Read a blocking iterator on a worker thread; yield its items, and a :class:`Wait` where none is ready.

    The worker hands each item over and wakes the wait; it reads at most
    ``WORKER_AHEAD`` items ahead.  Whatever the iterator raises is raised
    here.  Closing this generator before the iterator ended sets ``cancel``
    (which must unblock a read in progress) and joins the worker for up to
    ``join_s``; a worker still reading then is left, a daemon, and logged.
    """
    handed: Deque[Any] = deque()
    space = threading.Semaphore(WORKER_AHEAD)
    stop = threading.Event()
    wait = Wait(None, ready=lambda: bool(handed))

    def hand(item: Any) -> None:
        handed.append(item)
        wait.wake()

    def work() -> None:
        try:
            for item in open_items():
                while not space.acquire(timeout=WAIT_SLICE_S):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                hand(item)
        except BaseException as exc:  # handed to the reading thread
            hand(_Raised(exc))
        else:
            hand(_END)

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    ended = False
    try:
        while True:
            if not handed:
                yield wait
                continue
            item = handed.popleft()
            if item is _END:
                ended = True
                return
            if item.__class__ is _Raised:
                raise item.exc
            space.release()
            yield item
    finally:
        stop.set()
        if not ended and cancel is not None:
            cancel.set()
        worker.join(join_s)
        if worker.is_alive() and log is not None:
            log.warning("{} still reading {:g}s after its call ended: the client ignores cancel; thread left "
                        "(daemon)", name, join_s)
