"""The ``chat {model}`` span of one model call, and how a span the run's end cut short is marked.

Started and ended on the thread that drives the run; a call the run's end
left open (a cancel) is an ERROR whose ``error.type`` is the run's stop reason
(``cancelled``: this engine's own value, documented in docs/observability.md,
as the conventions name none for a cancelled operation).
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence

from opentelemetry.trace import SpanKind, Status, StatusCode

from . import conventions as c


def unfinished_text(reason: str) -> str:
    """A status description that names no content: what ended the run, in the engine's words."""
    return "the run was cancelled" if reason == "cancelled" else f"the run stopped: {reason}"


def mark_unfinished(span: Any, reason: str) -> None:
    """A span whose operation the run's end cut short: ERROR, ``error.type`` the run's stop reason."""
    if span.is_recording():
        span.set_attribute(c.ERROR_TYPE, reason)
        span.set_status(Status(StatusCode.ERROR, unfinished_text(reason)))


class ChatTrace:
    """The ``chat {model}`` span of one model call (one failover attempt)."""

    def __init__(self, run: Any, model: str, provider: str, base_url: Optional[str], options: Any,
                 stream: bool, messages: Sequence[Any]) -> None:
        # The run's instrumentation, not the run: the run holds its chats, and a chat that held the run
        # back would make the two a cycle, left to the garbage collector after every run.
        self.owner = run.owner
        self.answered = False  # the provider answered: the run's span names it
        self.started = time.monotonic()
        self.ended_at: Optional[float] = None
        self.first_chunk_at: Optional[float] = None
        self.open = True
        self.attributes: Dict[str, Any] = {c.OPERATION: "chat", c.PROVIDER: provider, c.REQUEST_MODEL: model,
                                           **c.server_of(base_url)}
        self.span = self.owner.tracer.start_span(f"chat {model}", context=run.context, kind=SpanKind.CLIENT)
        if self.span.is_recording():
            self.span.set_attributes({**self.attributes, c.REQUEST_STREAM: stream,
                                      **c.request_attributes(options)})
            if self.owner.capture.on_span and messages:
                self.span.set_attribute(c.INPUT_MESSAGES, c.input_messages(messages))

    def first_chunk(self) -> None:
        """The first *meaningful* chunk arrived (a keep-alive or an empty role delta is not one)."""
        if self.first_chunk_at is not None:
            return
        self.first_chunk_at = time.monotonic()
        ttfc = self.first_chunk_at - self.started
        if self.span.is_recording():
            self.span.set_attribute(c.RESPONSE_TIME_TO_FIRST_CHUNK, ttfc)
            self.span.add_event(c.FIRST_CHUNK_EVENT, {c.RESPONSE_TIME_TO_FIRST_CHUNK: ttfc})
        self.owner.instruments.time_to_first_chunk.record(ttfc, self.attributes)

    def succeeded(self, response: Any) -> None:
        self.answered = True
        metric = dict(self.attributes)
        if response.model:
            metric[c.RESPONSE_MODEL] = response.model
        if self.span.is_recording():
            if response.model:
                self.span.set_attribute(c.RESPONSE_MODEL, response.model)
            response_id = getattr(response, "id", None)
            if response_id:
                self.span.set_attribute(c.RESPONSE_ID, response_id)
            self.span.set_attribute(c.RESPONSE_FINISH_REASONS, c.finish_reasons(response.finish_reason))
            self.span.set_attributes(c.usage_attributes(response.usage))
            self._capture_output(response)
        self._record_usage(response.usage, metric)
        self._end(metric)

    def failed(self, exc: BaseException) -> None:
        kind = c.error_type(exc)
        if self.span.is_recording():
            self.span.set_attribute(c.ERROR_TYPE, kind)
            self.span.set_status(self.owner.error_status(kind, str(exc)))
        self._end({**self.attributes, c.ERROR_TYPE: kind})

    def abandoned(self, why: str) -> None:
        """The call did not complete (cancelled, or the run ended under it): an ERROR with ``why`` as its type."""
        if self.span.is_recording():
            self.span.set_attribute("streamengine.stop_reason", why)
        mark_unfinished(self.span, why)
        self._end({**self.attributes, c.ERROR_TYPE: why})

    def _capture_output(self, response: Any) -> None:
        capture = self.owner.capture
        if not capture.any:
            return
        output = c.output_messages(response.content, response.tool_calls, response.finish_reason)
        if capture.on_span:
            self.span.set_attribute(c.OUTPUT_MESSAGES, output)
        if capture.as_event:
            self.span.add_event(c.CONTENT_EVENT, {c.OUTPUT_MESSAGES: output})

    def _record_usage(self, usage: Any, attributes: Dict[str, Any]) -> None:
        if usage is None:
            return
        histogram = self.owner.instruments.token_usage
        histogram.record(usage.prompt_tokens, {**attributes, c.TOKEN_TYPE: "input"})
        histogram.record(usage.completion_tokens, {**attributes, c.TOKEN_TYPE: "output"})

    def _end(self, metric: Dict[str, Any]) -> None:
        if not self.open:
            return
        self.open = False
        self.ended_at = time.monotonic()
        self.owner.end_span(self.span, "ending a chat span")
        self.owner.instruments.operation_duration.record(self.ended_at - self.started, metric)

