"""The run's side of OpenTelemetry: chat spans per model attempt, tool spans per call.

Only used when the engine has an instrumentation (``opentelemetry-api``
installed); the round and the dispatcher then get these wrappers instead of
their plain callbacks, so an engine without it pays nothing per chunk.  Each
hook runs under the instrumentation's guard (``_otel.guard.Guard``): a span
processor or exemplar filter that raises costs the run its telemetry, never
an event (a ``tool_start``, a ``tool_result``, the round itself).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from .._errors import LlmCancelledError
from .._messages import Chunk, Response, ToolCall, ToolResult


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


def traced_tool_callbacks(run_trace: Any, registry: Any, on_start: Callable[[ToolCall], None],
                          on_result: Callable[[ToolResult, Optional[str]], None]) -> tuple:
    """The dispatcher's start and result callbacks, each also opening or closing the call's span.

    A local tool's span opens on the worker as its function is entered;
    a remote one's (process pool, Dask) is made when its result arrives,
    from the duration the remote worker reported.
    """
    guard = run_trace.owner.guard

    def tool_of(name: str) -> Any:
        return registry.get(name) if hasattr(registry, "get") else None

    def remote(name: str) -> bool:
        return getattr(tool_of(name), "executor", "local") == "remote"

    def started(call: ToolCall) -> None:
        if not remote(call.name):
            with guard("starting a tool span"):
                run_trace.tool_started(call, hand_over=bool(getattr(tool_of(call.name), "starts_itself", False)))
        on_start(call)

    def ended(result: ToolResult, skipped: Optional[str]) -> None:
        with guard("ending a tool span"):
            run_trace.tool_ended(result, remote=remote(result.name))
        on_result(result, skipped)

    return started, ended
