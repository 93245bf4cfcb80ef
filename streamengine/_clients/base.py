"""What the call strategies need from a provider client, and nothing more.

A client knows the wire format and the connection; it knows nothing of idle
timeouts or failover (those live in ``calls.py`` and ``failover.py``).
"""
from __future__ import annotations

import abc
import threading
from typing import Iterator, Optional, Sequence

from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec


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

    @abc.abstractmethod
    def stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
               options: Optional[CompletionOptions] = None,
               cancel: Optional[threading.Event] = None) -> Iterator[Chunk]:
        """Yield chunks as they arrive; the last one has ``is_completed=True``.

        Setting ``cancel`` (from any thread) must unblock a read in progress at
        once and end the iterator with :class:`LlmCancelledError`.  A stream
        that ends without completion raises :class:`LlmStreamError`.
        """
