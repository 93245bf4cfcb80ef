"""The loop of a wire whose SSE events are JSON objects named by their ``type`` (Anthropic, OpenAI Responses).

One home for what those wires share: each event is parsed as a JSON object
(anything else is a protocol error naming the wire; a plain-text ``error``
event keeps its text), handed to the wire's :meth:`TypedEventParser.chunk_of`,
and the stream is complete when the wire sets :attr:`ended`.  The
Chat Completions wire keeps its own loop: it is the hot path and has no
``type`` field.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Dict, Generator, Optional

import requests

from ..._errors import LlmProtocolError
from ..._messages import Chunk
from .connection import RequestTracker
from .sse_read import WAIT
from .transport import SseStreamParser


class TypedEventParser(SseStreamParser):
    """SSE events that are JSON objects -> chunks; a wire writes :meth:`chunk_of` and :meth:`plain_error`."""

    #: How the wire is named in the error for an event it cannot read.
    wire_name = "the"

    def run(self, resp: requests.Response, cancel: Optional[threading.Event],
            tracker: RequestTracker) -> Generator[Chunk, None, Chunk]:
        with self.reading(resp, cancel, tracker) as (events, flag):
            for name, data in events:
                if name is WAIT:  # the body would block: the run waits for it, with everything else
                    yield data
                    continue
                if flag.cancelled:
                    break
                self.events += 1
                chunk = self.chunk_of(name, self._frame(name, data))
                if chunk is not None:
                    yield chunk
                if self.ended:
                    return self.completed()
        return self.unfinished(cancel, tracker)

    def chunk_of(self, name: str, frame: Dict[str, Any]) -> Optional[Chunk]:
        """The chunk for one event (None: nothing meaningful); raise for an error, set ``ended`` at the end."""
        raise NotImplementedError

    def plain_error(self, text: str) -> Dict[str, Any]:
        """The frame for an ``error`` event whose data is plain text, in the wire's own error shape."""
        raise NotImplementedError

    def _frame(self, name: str, data: str) -> Dict[str, Any]:
        try:
            frame = json.loads(data)
        except ValueError as exc:
            if name == "error":  # a plain-text error event still says what went wrong
                return self.plain_error(data)
            raise LlmProtocolError(
                f"{self.url} sent a stream event that is not JSON ({exc}): {self.redact(data[:200])!r}; "
                f"the provider does not speak {self.wire_name} stream format") from exc
        if not isinstance(frame, dict):
            raise LlmProtocolError(
                f"{self.url} sent a stream event that is not a JSON object: {self.redact(data[:200])!r}; "
                f"the provider does not speak {self.wire_name} stream format")
        return frame
