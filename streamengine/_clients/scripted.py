"""An in-process, deterministic client: scripted turns instead of a provider.

For unit tests of everything above the client layer and for demos that must
not touch the network.  Each call to :meth:`ScriptedClient.stream` or
:meth:`ScriptedClient.complete` consumes the next *turn* (first in, first
out).  A turn is a sequence of items, played in order:

* a :class:`~streamengine._messages.Chunk` — yielded;
* a ``str`` — shorthand for ``Chunk(content=text)``;
* a number — sleep that many seconds, cut short by ``cancel``
  (``ScriptedClient.STALL`` = ``float("inf")`` waits until cancelled); the
  engine sees the pause as a :class:`~streamengine._clients.base.Wait` with
  no socket (so the run goes on meanwhile, as it does while a provider is
  silent), ``stream()`` sleeps it out;
* an exception instance or class — raised when reached.

A turn may also be a single ``str`` or exception.  Unless the turn already
holds a completed chunk or an exception, a completing chunk (last
``finish_reason`` or ``"stop"``, last usage, the requested model) is
appended, as a real provider's ``[DONE]`` would be; pass
``auto_complete=False`` to script a stream that just ends.

With no turn left, a call raises ``LlmHttpError(500)`` — the same answer
``FakeProvider`` gives, so in-process and loopback tests behave alike.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

from .._accumulate import ResponseAggregator
from .._errors import ConfigError, LlmCancelledError, LlmHttpError
from .._messages import Chunk, CompletionOptions, Message, MessageLike, Response, StopReason, ToolSpec, as_messages
from .._wait import Wait, chunks_only
from .base import StreamingLlmClient

TurnItem = Union[Chunk, str, float, int, BaseException, type]
Turn = Union[Sequence[TurnItem], str, BaseException]


@dataclass(frozen=True)
class ScriptedCall:
    """What one call received; ``streamed`` tells ``stream()`` from ``complete()``."""

    messages: Tuple[Message, ...]
    tools: Optional[Tuple[ToolSpec, ...]]
    options: Optional[CompletionOptions]
    streamed: bool


class ScriptedClient(StreamingLlmClient):
    """A :class:`StreamingLlmClient` that plays scripted turns; records every call in :attr:`calls`."""

    STALL = float("inf")

    def __init__(self, turns: Sequence[Turn] = (), *, auto_complete: bool = True, model: str = "scripted") -> None:
        self._turns: List[Tuple[TurnItem, ...]] = []
        self._lock = threading.Lock()
        self.auto_complete = auto_complete
        self.model = model
        self.calls: List[ScriptedCall] = []
        self.closed = False
        for turn in turns:
            self.add_turn(turn)

    def add_turn(self, *items: Any) -> None:
        """Append one turn: ``add_turn("Hel", "lo")`` or ``add_turn([chunk, 0.1, exc])``."""
        if len(items) == 1 and isinstance(items[0], (list, tuple)):
            items = tuple(items[0])
        for item in items:
            _check_item(item)
        with self._lock:
            self._turns.append(tuple(items))

    @property
    def remaining(self) -> int:
        """Turns not consumed yet."""
        return len(self._turns)

    def _call(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
              options: Optional[CompletionOptions], cancel: Optional[threading.Event],
              streamed: bool) -> Iterator[Union[Chunk, Wait]]:
        """Record the call and take its turn now; the returned iterator plays it."""
        call = ScriptedCall(tuple(as_messages(messages)), tuple(tools) if tools is not None else None,
                            options, streamed)
        with self._lock:
            self.calls.append(call)
            if not self._turns:
                raise LlmHttpError(
                    500, '{"error":{"message":"ScriptedClient: no scripted turn left"}}',
                    message="ScriptedClient: no scripted turn left; add one with add_turn() "
                            f"(this was call {len(self.calls)})")
            turn = self._turns.pop(0)
        model = (options.model if options is not None and options.model else None) or self.model
        return self._play(turn, model, cancel)

    def stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
               options: Optional[CompletionOptions] = None,
               cancel: Optional[threading.Event] = None) -> Iterator[Chunk]:
        # Not a generator function itself: the call is recorded and the turn
        # consumed when stream() is called, not on the first next().
        return chunks_only(self._call(messages, tools, options, cancel, streamed=True))

    def open_stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None,
                    cancel: Optional[threading.Event] = None) -> Iterator[Union[Chunk, Wait]]:
        if type(self).stream is not ScriptedClient.stream:  # a subclass's own stream() blocks: read it on a worker
            return super().open_stream(messages, tools, options, cancel)
        return self._call(messages, tools, options, cancel, streamed=True)

    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None) -> Response:
        aggregator = ResponseAggregator()
        for chunk in chunks_only(self._call(messages, tools, options, cancel, streamed=False)):
            aggregator.add(chunk)
        return aggregator.response()

    def _play(self, turn: Tuple[TurnItem, ...], model: str,
              cancel: Optional[threading.Event]) -> Iterator[Union[Chunk, Wait]]:
        finish_reason = None
        usage = None
        for item in turn:
            _raise_if_cancelled(cancel)
            if isinstance(item, Chunk):
                finish_reason = item.finish_reason or finish_reason
                usage = item.usage if item.usage is not None else usage
                yield item
                if item.is_completed:
                    return
            elif isinstance(item, str):
                yield Chunk(content=item)
            elif isinstance(item, (int, float)):
                yield from _pause(float(item), cancel)
            else:
                raise item
        _raise_if_cancelled(cancel)
        if self.auto_complete:
            yield Chunk(is_completed=True, finish_reason=finish_reason or StopReason.STOP, usage=usage, model=model)

    def close(self) -> None:
        self.closed = True


def _check_item(item: Any) -> None:
    if isinstance(item, (Chunk, str, BaseException)):
        return
    if isinstance(item, type) and issubclass(item, BaseException):
        return
    if isinstance(item, (int, float)) and not isinstance(item, bool) and item >= 0:
        return
    raise ConfigError(
        f"a scripted turn item must be a Chunk, a str, a sleep in seconds (>= 0) or an exception, got {item!r}")


def _raise_if_cancelled(cancel: Optional[threading.Event]) -> None:
    if cancel is not None and cancel.is_set():
        raise LlmCancelledError("ScriptedClient: the call was cancelled")


def _pause(seconds: float, cancel: Optional[threading.Event]) -> Iterator[Wait]:
    """A silent model: waits until ``seconds`` passed, ended at once by ``cancel``; ``inf`` only by the cancel."""
    if cancel is None and seconds == float("inf"):
        raise ConfigError("ScriptedClient.STALL needs a cancel event, or it would block forever")
    until = time.monotonic() + seconds
    wait = Wait(None, until, ready=cancel.is_set if cancel is not None else None)
    while time.monotonic() < until:
        wait.until = until
        yield wait
        if cancel is not None and cancel.is_set():
            raise LlmCancelledError("ScriptedClient: the call was cancelled while the model was silent")
