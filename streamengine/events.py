"""What the library tells the world while it works: model chunk events and engine events.

Two audiences, two shapes:

* **Call-level** — :class:`ModelChunkEvent` goes to an :class:`EventEmitter`
  for every chunk a call strategy reads, and :class:`Observer` objects hear
  ``on_llm_responded(response)`` once per successful call.  These are for
  metrics, tracing and debugging UIs.
* **Engine-level** — :class:`TokenEvent`, :class:`ToolStartEvent` and friends
  are what ``StreamingEngine.run()`` yields to its caller (and what ``sse.py``
  turns into frames).  Each has a ``name`` class attribute that is the SSE
  event name.

Subscribers and observers run **inline**, in the thread that reads the
stream: a slow one slows the stream for everybody, so they should hand heavy
work to a queue of their own.  A subscriber or observer that raises is logged
and skipped — a broken metrics hook must not fail an answer already paid for.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Optional, Protocol, Tuple, Union,
    runtime_checkable,
)

from .errors import ConfigError
from .logs import component_logger
from .messages import Chunk, Response, ToolCall

if TYPE_CHECKING:  # engine-level types live in upper layers; only hints need them
    from .messages import ToolResult
    from .result import EngineResult


# --------------------------------------------------------------------------- call level

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
    being called.  ``bool(emitter)`` is False while nobody listens, which lets
    the per-token path skip building events nobody would see.
    """

    def __init__(self) -> None:
        self._subscribers: Tuple[Subscriber, ...] = ()
        self._lock = threading.Lock()
        self._log = component_logger("streamengine.events.EventEmitter")

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every emitted event; returns ``unsubscribe()``."""
        if not callable(callback):
            raise ConfigError(f"an event subscriber must be callable, got {type(callback).__name__}")
        with self._lock:
            self._subscribers = self._subscribers + (callback,)

        def unsubscribe() -> None:
            with self._lock:
                subs = list(self._subscribers)
                if callback in subs:
                    subs.remove(callback)
                    self._subscribers = tuple(subs)

        return unsubscribe

    def emit(self, event: Any) -> None:
        """Deliver ``event`` to each subscriber in subscription order, inline."""
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                self._log.opt(exception=True).warning(
                    "event subscriber {!r} raised on {}; skipped", callback, type(event).__name__)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def __bool__(self) -> bool:
        return bool(self._subscribers)

    def __len__(self) -> int:
        return len(self._subscribers)


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
                "observers must implement streamengine.events.Observer"
            )
    return checked


# --------------------------------------------------------------------------- engine level

@dataclass(frozen=True)
class TokenEvent:
    """Visible answer text, as it streams."""

    name: ClassVar[str] = "token"
    text: str

    # By hand, not generated: one per visible token (see messages.Chunk).
    def __init__(self, text: str) -> None:
        self.__dict__["text"] = text


@dataclass(frozen=True)
class ToolStartEvent:
    """A tool's function was entered: its deadline counts from here (not from a wait for a worker)."""

    name: ClassVar[str] = "tool_start"
    call: ToolCall


@dataclass(frozen=True)
class ToolResultEvent:
    """A tool finished, failed, timed out or was skipped: sent the moment that is known."""

    name: ClassVar[str] = "tool_result"
    result: "ToolResult"


@dataclass(frozen=True)
class RoundEvent:
    """A new model round began (round 1 is the first answer, 2 the first continuation)."""

    name: ClassVar[str] = "round"
    round: int


@dataclass(frozen=True)
class ErrorEvent:
    """Something went wrong; ``message`` says what, for a person.

    ``fatal`` is True when the run failed or stopped early because of it;
    False for a problem the run went on past (a tool block the model wrote
    that could not be read, a result that could not be filed in the store).
    """

    name: ClassVar[str] = "error"
    message: str
    fatal: bool = True


@dataclass(frozen=True)
class ResetEvent:
    """Discard the text of round ``round`` shown so far: it is streamed again on another model.

    Only sent with ``EngineConfig(failover_after_tokens=True)``, when a model
    failed mid-answer and another model is left; ``reason`` says which failed.
    """

    name: ClassVar[str] = "reset"
    round: int
    reason: str


@dataclass(frozen=True)
class DoneEvent:
    """The run ended; ``result`` holds the answer and telemetry."""

    name: ClassVar[str] = "done"
    result: "EngineResult"


@dataclass(frozen=True)
class HeartbeatEvent:
    """Nothing happened for a while; only sent when the caller asked for heartbeats.

    SSE renders it as the comment ``: ping`` so proxies and WSGI servers
    notice a gone client.
    """

    name: ClassVar[str] = "heartbeat"


Event = Union[TokenEvent, ToolStartEvent, ToolResultEvent, RoundEvent, ResetEvent, ErrorEvent, DoneEvent,
              HeartbeatEvent]

__all__ = [
    "DoneEvent", "ErrorEvent", "Event", "EventEmitter", "HeartbeatEvent", "ModelChunkEvent",
    "Observer", "ResetEvent", "RoundEvent", "TokenEvent", "ToolResultEvent", "ToolStartEvent",
]
