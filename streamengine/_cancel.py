"""Cancellation that reaches a thread blocked in a socket read.

A plain :class:`threading.Event` can only be polled; a read blocked in
``recv`` never polls.  :class:`CancelToken` is an Event whose ``set()`` also
runs callbacks (for example "shut down this socket"), so cancelling takes
effect at once.  :func:`on_cancel` accepts any Event: for a plain one it
bridges with a short-lived watcher thread that ends when the caller is done.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

from ._logs import component_logger

Callback = Callable[[], None]

_log = component_logger("streamengine.cancel")


def no_callback() -> None:
    """The callback (and remover) that does nothing: one function, not a fresh lambda each time."""
_WATCH_POLL_S = 0.02


class CancelToken(threading.Event):
    """An Event whose ``set()`` runs registered callbacks once, in the setting thread.

    ``cancelled`` mirrors ``is_set()`` as a plain attribute (the wire parsers read it).
    """

    cancelled = False
    #: When ``set()`` first ran (monotonic), None before: kept here, not by a callback of the owner's
    #: (a callback that is a bound method makes the owner and its token a cycle for the collector).
    set_at: Optional[float] = None

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: List[Callback] = []
        self._callbacks_lock = threading.Lock()

    def add_callback(self, callback: Callback) -> Callback:
        """Run ``callback`` on cancel (at once if already cancelled); returns a remover."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return _Remover(self, callback)
        _run_safely(callback)
        return no_callback

    def _remove(self, callback: Callback) -> None:
        with self._callbacks_lock:
            if callback in self._callbacks:  # gone already once set() ran them
                self._callbacks.remove(callback)

    def set(self) -> None:
        with self._callbacks_lock:
            if self.is_set():
                return
            self.set_at = time.monotonic()  # first: whoever sees the flag up also sees when it went up
            super().set()
            self.cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run_safely(callback)

    def clear(self) -> None:
        with self._callbacks_lock:
            super().clear()
            self.cancelled = False


class _Remover:
    """``add_callback``'s remover: takes the callback off once, then holds neither it nor the token.

    Whoever keeps a remover often is what the callback points back to (a tool
    handle and its ``cancel``): a remover that held on after use would make
    the two a cycle that only the garbage collector frees.
    """

    __slots__ = ("_callback", "_token")

    def __init__(self, token: CancelToken, callback: Callback) -> None:
        self._token: Optional[CancelToken] = token
        self._callback: Optional[Callback] = callback

    def __call__(self) -> None:
        token, callback = self._token, self._callback
        if token is not None and callback is not None:
            self._token = self._callback = None
            token._remove(callback)


def _run_safely(callback: Callback) -> None:
    try:
        callback()
    except Exception:  # a failing cleanup must not stop the other cleanups
        _log.opt(exception=True).warning("cancel callback failed")


class _Polled:
    """``cancelled`` of a plain Event (a method call each time) or of no event at all (never)."""

    __slots__ = ("_event",)

    def __init__(self, event: Optional[threading.Event]) -> None:
        self._event = event

    @property
    def cancelled(self) -> bool:
        return self._event is not None and self._event.is_set()


def cancel_flag(event: Optional[threading.Event]) -> CancelToken | _Polled:
    """Something whose ``cancelled`` says whether ``event`` is set: a CancelToken itself (an attribute read)."""
    return event if isinstance(event, CancelToken) else _Polled(event)


def on_cancel(event: Optional[threading.Event], callback: Callback) -> Callback:
    """Run ``callback`` when ``event`` is set; returns ``stop()`` to call when done.

    With a :class:`CancelToken` this costs nothing.  With a plain Event a
    daemon watcher polls it every 20 ms until ``stop()`` is called, so the
    watcher never outlives the call that started it by more than one poll.
    """
    if event is None:
        return no_callback
    if isinstance(event, CancelToken):
        return event.add_callback(callback)
    if event.is_set():
        _run_safely(callback)
        return no_callback
    finished = threading.Event()

    def watch() -> None:
        while not finished.is_set():
            if event.wait(_WATCH_POLL_S):
                if not finished.is_set():
                    _run_safely(callback)
                return

    threading.Thread(target=watch, name="streamengine-cancel-watch", daemon=True).start()
    return finished.set
