"""One run's events and its one wait, in the thread that iterates the run.

The run is a generator (``RoundRunner.run``) driven by whoever iterates
``engine.run()``: the WSGI server's thread for a served stream, the script's
thread for ``complete()``.  Where the run would block, the layers below pass
a :class:`~streamengine._clients.base.Wait` up; :meth:`RunLoop.batches`
then

1. hands the consumer every event that is ready (one list: a WSGI stream
   writes it as one batch), timing how long the consumer keeps the thread:
   that time is added to the wait's ``held``, so the model's idle clock
   never counts it;
2. waits once, on one selector (``poll``), for the wait's socket and the
   run's wake-up pipe, until the nearest of the wait's deadlines (the call's
   idle deadline and cap, a scripted pause), the earliest tool deadline and
   the next heartbeat.

A tool worker that puts an event (``tool_start``, ``tool_result``), a cancel
from any thread and a buffered call's worker write one byte to the pipe, so
the wait ends at once; a tool deadline fixes its timeout result here, at the
deadline.  No other thread takes part: a token costs one wake-up, as in a
relay.  A wait on a socket goes on after a wake-up by the pipe (the socket
has nothing yet); a wait without one (a tool, a pause) lets its generator
look again.

Events are put from any thread into one deque, so their order is the order
they happened in; only threads other than the driving one write the pipe.
"""
from __future__ import annotations

import collections
import os
import select
import selectors
import threading
import time
from typing import Any, Callable, Deque, Generator, Iterator, List, Optional, Sized, Tuple

from .._cancel import CancelToken, no_callback
from .._wait import Wait
from .events import Event, HeartbeatEvent

_NEVER = float("inf")
_monotonic = time.monotonic
_MAX_MS = 86_400_000.0  # a day: poll() refuses what does not fit its int
#: Heartbeats carry nothing: one frozen instance serves every one.
HEARTBEAT = HeartbeatEvent()
#: A wait whose end another thread signals through a flag looks at the flag at least this often.
_READY_SLICE_S = 0.25


def _never() -> float:
    return _NEVER


class Heartbeat:
    """A run's heartbeat, settable while it runs (``Run.set_heartbeat``): its loop's, once it has one."""

    __slots__ = ("loop", "seconds")

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.loop: Optional[RunLoop] = None

    def set(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        if self.loop is not None:
            self.loop.set_heartbeat(seconds)


class RunLoop:
    """The outbox, the wake-up pipe and the selector of one run; see the module doc.

    ``tools_due()`` says when the earliest tool deadline is (monotonic),
    ``on_tools_due()`` fixes the results of tools past theirs; both run in the
    driving thread, and only while ``tools_pending`` (the dispatcher's list of
    calls whose result is not fixed yet) is non-empty.
    """

    def __init__(self, cancel: CancelToken, heartbeat_s: Optional[float]) -> None:
        self.cancel = cancel
        self._beat_s = _NEVER if heartbeat_s is None else heartbeat_s
        self.outbox: Deque[Event] = collections.deque()
        self.tools_due: Callable[[], float] = _never
        self.on_tools_due: Callable[[], None] = no_callback
        self.tools_pending: Sized = ()  # tool deadlines are asked for only while this is non-empty
        self.handed: List[Event] = []  # the last batch handed to the consumer
        self._driver: Optional[int] = None  # the ident of the thread that drives the run
        self._lock = threading.Lock()
        self._closed = False
        self._read_end, self._write_end = os.pipe()
        os.set_blocking(self._read_end, False)
        os.set_blocking(self._write_end, False)
        self._selector = _Selector(self._read_end)
        self._unwatch = cancel.add_callback(self.wake)

    # --- any thread ------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        """Queue ``event`` for the consumer; from a thread other than the driver's, also end the driver's wait."""
        self.outbox.append(event)
        if threading.get_ident() != self._driver:
            self.wake()

    def wake(self) -> None:
        """End the driving thread's wait now (a tool finished, a cancel, a worker's flag)."""
        with self._lock:  # never write to a descriptor number close() has freed for reuse
            if self._closed:
                return
            try:
                os.write(self._write_end, b"\0")
            except (BlockingIOError, OSError):
                pass  # the pipe is full: the driver has a wake-up waiting already

    def close(self) -> None:
        """The run is over: stop following the cancel, free the pipe and the selector.

        The references back into the run (its tool calls) are dropped too: the
        run's objects then die with their last reference, not in a garbage
        collection's cycle search (tests/engine/test_one_thread.py checks).
        """
        self._unwatch()
        self._unwatch = no_callback
        self.tools_due, self.on_tools_due, self.tools_pending = _never, no_callback, ()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._selector.close()
            os.close(self._read_end)
            os.close(self._write_end)

    # --- the driving thread --------------------------------------------------------------
    def set_heartbeat(self, seconds: Optional[float]) -> None:
        """A heartbeat after ``seconds`` of silence from now on (None: none); the next wait counts with it."""
        self._beat_s = _NEVER if seconds is None else seconds

    def batches(self, steps: Generator[Wait, None, Any]) -> Iterator[List[Event]]:
        """Drive ``steps`` to its end; yield the events that are ready each time it would wait.

        The time the consumer keeps each batch is added to the wait's ``held``.
        Names are bound to locals, and a batch of one event (a token) is taken
        without a call: bench section 14 counts both, once a token.
        """
        self._driver = threading.get_ident()
        out, waited, send = self.outbox, self._waited, steps.send
        popleft = out.popleft
        self._last_out = _monotonic()
        try:
            wait = next(steps)
            while True:
                if out:
                    batch = [popleft()] if len(out) == 1 else self._take()
                    self.handed = batch
                    handed = _monotonic()
                    yield batch
                    self._last_out = now = _monotonic()
                    wait.held += now - handed
                if waited(wait):
                    wait = send(None)
        except StopIteration:
            pass
        except GeneratorExit:
            raise
        except BaseException:  # a KeyboardInterrupt the run passed on: what it told goes out first
            if self.outbox:
                self.handed = self._take()
                yield self.handed
            raise
        if self.outbox:
            self.handed = self._take()
            yield self.handed

    def _take(self) -> List[Event]:
        """Every event queued now (workers may append meanwhile: those wait for the next batch)."""
        popleft = self.outbox.popleft
        return [popleft() for _ in range(len(self.outbox))]

    def _waited(self, wait: Wait) -> bool:
        """Wait once for ``wait``; True when its generator should look again."""
        ready = wait.ready
        if ready is not None:
            wait.waker = self.wake
            if ready():
                return True
        cancel = self.cancel
        if cancel.cancelled:
            return True
        now = _monotonic()
        due = wait.idle_until + wait.held  # wait.due(), without the call: bench section 14
        if wait.until < due:
            due = wait.until
        tools = _NEVER
        if self.tools_pending:
            tools = self.tools_due()
            if tools <= now:
                self.on_tools_due()
                tools = self.tools_due()
                if self.outbox:
                    return False  # hand the results over first; the wait goes on after
        if due <= now:
            return True
        until = due if due < tools else tools
        beat = self._last_out + self._beat_s
        if beat < until:
            until = beat
        if ready is not None and until > now + _READY_SLICE_S:
            until = now + _READY_SLICE_S
        fileobj = wait.fileobj
        selector = self._selector
        if fileobj is not selector.current:
            selector.switch(fileobj)
        poll = selector.poll
        if poll is None:  # pragma: no cover - Windows
            readable, woken = selector.select(until - now)
        else:
            ms = (until - now) * 1000.0  # poll() takes float milliseconds, rounded up
            found = poll(0 if ms <= 0 else ms if ms < _MAX_MS else _MAX_MS)
            readable = woken = False
            if found:  # the socket's descriptor, the pipe's, or both
                if len(found) > 1:
                    readable = woken = True
                elif found[0][0] == self._read_end:
                    woken = True
                else:
                    readable = True
        if woken:
            self._drain_pipe()
        now = _monotonic()
        if tools <= now:
            self.on_tools_due()
        if beat <= now and not self.outbox:
            self.outbox.append(HEARTBEAT)
        if readable or now >= due or cancel.cancelled:
            return True
        return fileobj is None and (woken or (ready is not None and ready()))

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._read_end, 4096):
                pass
        except (BlockingIOError, OSError):
            pass


class _Selector:
    """The run's one selector: the wake-up pipe, plus the socket of the wait at hand (re-registered on change).

    ``poll`` is the bound ``poll()`` of a ``select.poll`` object, which
    :meth:`RunLoop._waited` calls itself;
    None where there is no poll() (Windows), and :meth:`select` waits instead.
    """

    def __init__(self, pipe: int) -> None:
        self._pipe = pipe
        self.current: Any = None
        self._fd: Optional[int] = None
        if hasattr(select, "poll"):
            self._poll: Any = select.poll()
            self._poll.register(pipe, select.POLLIN)
            self.poll: Optional[Callable[[float], List[Tuple[int, int]]]] = self._poll.poll
            self._selectors: Optional[selectors.BaseSelector] = None
        else:  # pragma: no cover - Windows: no poll(); selectors picks what there is
            self._poll = self.poll = None
            self._selectors = selectors.DefaultSelector()
            self._selectors.register(pipe, selectors.EVENT_READ)

    def select(self, timeout: float) -> tuple[bool, bool]:  # pragma: no cover - Windows
        """(the socket is readable, the pipe was written) within ``timeout`` seconds."""
        assert self._selectors is not None
        keys = self._selectors.select(max(0.0, min(timeout, 86400.0)))
        woken = any(key.fd == self._pipe for key, _ in keys)
        return len(keys) > int(woken), woken

    def switch(self, fileobj: Any) -> None:
        """Watch ``fileobj`` (a socket, or None) from now on, instead of the one before."""
        # By descriptor number, taken at registration: a socket closed since has none to give.
        old, self.current = self._fd, fileobj
        self._fd = None
        if old is not None:
            try:
                (self._poll if self._poll is not None else self._selectors).unregister(old)  # type: ignore[union-attr]
            except (KeyError, ValueError, OSError):
                pass
        if fileobj is None:
            return
        fd = fileobj.fileno()
        if fd < 0:
            return  # closed: the generator finds out when it reads
        if self._poll is not None:
            self._poll.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        else:  # pragma: no cover
            self._selectors.register(fd, selectors.EVENT_READ)  # type: ignore[union-attr]
        self._fd = fd

    def close(self) -> None:
        if self._selectors is not None:  # pragma: no cover
            self._selectors.close()
