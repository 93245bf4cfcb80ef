"""What the call strategies need from a provider client, and nothing more.

A client knows the wire format and the connection; it knows nothing of idle
timeouts or failover (those live in ``_calls``).

**Waits instead of blocking reads.**  A run is driven by the thread that
iterates it (the WSGI server's thread, the script's thread), so nothing below
the run may block in a read.  The call strategy reads
:meth:`StreamingLlmClient.open_stream`: chunks, and a :class:`~streamengine._wait.Wait`
wherever the client would otherwise block.  The clients streamengine ships
yield those themselves; a client of your own that only writes a blocking
``stream()`` is read on a worker thread by the default ``open_stream``
(:func:`~streamengine._wait.on_worker`).  ``stream()`` stays chunks only, for
every caller that iterates it directly.
"""
from __future__ import annotations

import abc
import threading
from typing import Iterator, Optional, Sequence, Union

from .._logs import component_logger
from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec
from .._wait import Wait, on_worker

#: How long a closed stream's worker (a client that blocks in ``stream()``) is waited for to end.
WORKER_JOIN_S = 2.0
_log = component_logger("streamengine.clients")


class LlmClient(abc.ABC):
    """A provider that answers a conversation in one piece."""

    @abc.abstractmethod
    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None) -> Response:
        """Return the whole answer; setting ``cancel`` aborts the request at once."""

    def check_parts(self, messages: Sequence[MessageLike], model: Optional[str] = None) -> None:  # noqa: B027
        """Raise :class:`ConfigError` if ``model``'s API cannot carry a part of ``messages`` (an image, audio, a
        file); the default: every part can go (a client of your own sends what it is given)."""

    def close(self) -> None:  # noqa: B027 - a default, not abstract: clients without pooled connections need not override it
        """Release pooled connections; the default holds none."""


class StreamingLlmClient(LlmClient):
    """A provider that can also stream its answer chunk by chunk."""

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
        """Chunks, and a :class:`Wait` wherever the stream would block.

        The default reads :meth:`stream` on a worker thread and hands its
        chunks over (:func:`~streamengine._wait.on_worker`): a client that
        blocks in its reads works unchanged, at one thread a stream.  Setting
        ``cancel`` must unblock its read.
        """
        return on_worker(lambda: self.stream(messages, tools, options, cancel),
                         f"streamengine-stream-{type(self).__name__}", WORKER_JOIN_S, _log, cancel)
