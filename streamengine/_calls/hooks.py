"""Call-level hooks: a chunk event for every chunk a call reads, observers of whole responses.

:class:`ModelChunkEvent` goes to an :class:`EventEmitter` for every chunk a
call strategy reads, and :class:`Observer` objects hear
``on_llm_responded(response)`` once per successful call: for metrics,
tracing and debugging UIs.  They live with the calls (not the engine's
events) because the call strategies, one layer below the engine, emit them.

Subscribers and observers run **inline**, in the thread that reads the
stream: a slow one slows the stream for everybody, so they should hand heavy
work to a queue of their own.  A subscriber or observer that raises is logged
and skipped: a broken metrics hook must not fail an answer already paid for.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Tuple, runtime_checkable

from .._errors import ConfigError
from .._logs import component_logger
from .._messages import Chunk, Response


@dataclass(frozen=True)
class ModelChunkEvent:
    """One chunk read from the model; ``is_final`` marks the completing chunk.

    The final event of a successful call carries the aggregated ``response``;
    every other event has ``response=None``.  A call that fails emits no final
    event.
    """

    chunk: Chunk
    is_final: bool = False
    response: Optional[Response] = None


@runtime_checkable
class Observer(Protocol):
    """Hears about every successful model call, once, with the aggregated response.

    Runs inline in the calling thread after the stream completed: keep it fast.
    """

    def on_llm_responded(self, response: Response) -> None:
        ...  # pragma: no cover - protocol


Subscriber = Callable[[Any], None]


class EventEmitter:
    """A minimal synchronous publish/subscribe hub.

    The subscriber list is replaced, never mutated, so ``emit`` iterates a
    snapshot without a lock and a callback may unsubscribe itself while
    being called.  ``subscribers`` (that snapshot) is empty and ``bool(emitter)``
    False while nobody listens, which lets the per-token path skip building
    events nobody would see.
    """

    def __init__(self) -> None:
        #: The snapshot; the per-chunk ``if emitter.subscribers`` is an attribute read, ``bool(emitter)`` a call.
        self.subscribers: Tuple[Subscriber, ...] = ()
        self._lock = threading.Lock()
        self._log = component_logger("streamengine._calls.hooks.EventEmitter")

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every emitted event; returns ``unsubscribe()``."""
        if not callable(callback):
            raise ConfigError(f"an event subscriber must be callable, got {type(callback).__name__}")
        with self._lock:
            self.subscribers = self.subscribers + (callback,)

        def unsubscribe() -> None:
            with self._lock:
                subs = list(self.subscribers)
                if callback in subs:
                    subs.remove(callback)
                    self.subscribers = tuple(subs)

        return unsubscribe

    def emit(self, event: Any) -> None:
        """Deliver ``event`` to each subscriber in subscription order, inline."""
        for callback in self.subscribers:
            try:
                callback(event)
            except Exception:
                self._log.opt(exception=True).warning(
                    "event subscriber {!r} raised on {}; skipped", callback, type(event).__name__)

    @property
    def subscriber_count(self) -> int:
        return len(self.subscribers)

    def __bool__(self) -> bool:
        return bool(self.subscribers)

    def __len__(self) -> int:
        return len(self.subscribers)


def notify_observers(observers: Iterable[Observer], response: Response, log: Any) -> None:
    """Call ``on_llm_responded`` on each observer; a failing one is logged, not raised."""
    for observer in observers:
        try:
            observer.on_llm_responded(response)
        except Exception:
            log.opt(exception=True).warning("observer {!r} raised in on_llm_responded; skipped", observer)


def check_observers(observers: Iterable[Any]) -> Tuple[Observer, ...]:
    """Validate at construction, so a typo surfaces now and not after the first paid call."""
    checked = tuple(observers or ())
    for observer in checked:
        if not callable(getattr(observer, "on_llm_responded", None)):
            raise ConfigError(
                f"observer {observer!r} has no on_llm_responded(response) method; "
                "observers must implement streamengine._calls.hooks.Observer"
            )
    return checked
