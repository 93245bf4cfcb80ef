"""The run's side of OpenTelemetry: chat spans per model attempt (tool spans: ``tool_calls``).

Only used when the engine has an instrumentation (``opentelemetry-api``
installed); the round then gets these wrappers instead of its plain
callbacks, so an engine without it pays nothing per chunk.  Each
hook runs under the instrumentation's guard (``_otel.guard.Guard``): a span
processor or exemplar filter that raises costs the run its telemetry, never
an event (a ``tool_start``, a ``tool_result``, the round itself).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .._errors import LlmCancelledError
from .._messages import Chunk, Response


class RoundTrace:
    """One round's model attempts as ``chat`` spans: started, first chunk, failed or succeeded."""

    def __init__(self, run_trace: Any, messages: Sequence[Any], options: Any) -> None:
        self.run_trace = run_trace
        self.guard = run_trace.owner.guard
        self.messages = messages
        self.options = options
        self.chat: Any = None
        self.seen_output = False

    def started(self, model: str) -> None:
        self.chat = None
        self.seen_output = False
        with self.guard("starting a chat span"):
            self.chat = self.run_trace.chat_started(model=model, options=self.options, messages=self.messages)

    def failed(self, _model: str, exc: BaseException) -> None:
        chat, self.chat = self.chat, None
        if chat is None:
            return
        with self.guard("ending a chat span"):
            if isinstance(exc, LlmCancelledError):
                chat.abandoned("cancelled")
            else:
                chat.failed(exc)

    def succeeded(self, response: Response) -> None:
        chat, self.chat = self.chat, None
        if chat is not None:
            with self.guard("ending a chat span"):
                chat.succeeded(response)

    def watching(self, on_chunk: Callable[[Chunk], None]) -> Callable[[Chunk], None]:
        """``on_chunk`` that also marks the attempt's first *meaningful* chunk (the engine's own rule).

        Unwrapped when nothing would record it (no SDK): a chunk then costs what it costs untraced.
        """
        if not self.run_trace.watches_chunks:
            return on_chunk

        def hooked(chunk: Chunk) -> None:
            if not self.seen_output and chunk.is_meaningful and self.chat is not None:
                self.seen_output = True
                with self.guard("marking the first chunk"):
                    self.chat.first_chunk()
            on_chunk(chunk)
        return hooked
