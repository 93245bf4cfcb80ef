"""The call strategy for clients that cannot stream: ``complete()`` on a worker, waited for without blocking.

So that the engine handles both strategies alike, a successful call hands
``on_chunk`` one synthesized completed chunk with the whole answer (see
:class:`BufferedCallStrategy`).  The wait is a :class:`Wait` without a
socket that the worker ends (``Wait.wake``), so the run's loop goes on
meanwhile (tool results, heartbeats, a cancel).
"""
from __future__ import annotations

import threading
import time
from typing import Optional, Sequence

from .._cancel import CancelToken, on_cancel
from .._errors import LlmCancelledError, LlmTimeoutError
from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolCallDelta, ToolSpec
from .._wait import Flag, Wait
from .strategies import (
    VERB_UNAVAILABLE,
    CallStrategy,
    OnChunk,
    OnToolCalls,
    Steps,
    _describe_exception,
    _model_of,
    refuse_if_cancelled,
)


class BufferedCallStrategy(CallStrategy):
    """Calls ``client.complete()`` in a worker thread and waits up to ``completion_timeout``.

    So that the engine handles both strategies alike, a successful call hands
    ``on_chunk`` exactly one synthesized completed :class:`Chunk` carrying the
    whole content, the tool calls as :class:`ToolCallDelta` (index = position),
    usage, model and finish reason; the emitter gets the same chunk as the
    final :class:`ModelChunkEvent`.
    """

    def stream_call(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None,
                    on_chunk: Optional[OnChunk] = None, on_tool_calls: Optional[OnToolCalls] = None) -> Steps:
        refuse_if_cancelled(cancel)
        token = CancelToken()
        done = Flag()
        wait = Wait(None, ready=done.is_set)
        done.wake = wait.wake
        token.add_callback(done.set)
        box: dict = {}

        def work() -> None:
            try:
                box["response"] = self.client.complete(messages, tools, options, cancel=token)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=work, name=f"streamengine-complete[{_model_of(options)}]", daemon=True)
        stop_following = on_cancel(cancel, token.set)
        started = time.monotonic()
        finished = False
        try:
            worker.start()
            deadline = started + self.completion_timeout
            while not done.is_set() and time.monotonic() < deadline:
                wait.until = deadline
                yield wait
            finished = done.is_set()
        finally:
            stop_following()
            cancelled = token.is_set()  # only the caller sets it before this point
            if cancelled or "response" not in box:
                self._stop_worker(worker, token)
            else:
                worker.join(self.join_timeout)
        response = self._outcome(box, cancelled, finished, options, started)
        self.output_limits.check(response)  # already in memory, but never handed on past a cap
        chunk = _chunk_of(response)
        if on_chunk is not None:
            on_chunk(chunk)
        self._succeeded(response, chunk)
        return response

    def _outcome(self, box: dict, cancelled: bool, finished: bool, options: Optional[CompletionOptions],
                 started: float) -> Response:
        waited = time.monotonic() - started
        error = box.get("error")
        if cancelled:
            raise LlmCancelledError(f"LLM call cancelled by the caller after {waited:.3f}s") from error
        if "response" in box:
            return box["response"]
        if finished and error is not None:
            raise error
        # Timed out: the worker was cancelled above, so its error (if any) is the cancel it saw.
        limit = self.completion_timeout
        message = (f"LLM buffered completion timeout: no response received within {limit:g}s "
                   "(model may be unavailable or overloaded)")
        self._log.warning("{} — model {}, after {:.3f}s; transport: {}",
                          message, _model_of(options), waited, _describe_exception(error))
        raise LlmTimeoutError(message, timeout_s=limit, chunks_received=0, verb=VERB_UNAVAILABLE) from error


def _chunk_of(response: Response) -> Chunk:
    """One completed chunk that says everything a buffered response says."""
    deltas = tuple(ToolCallDelta(index, call.id, call.name, call.arguments)
                   for index, call in enumerate(response.tool_calls))
    return Chunk(content=response.content or None, tool_calls=deltas, is_completed=True,
                 usage=response.usage, finish_reason=response.finish_reason, model=response.model,
                 refusal=response.refusal, reasoning=response.reasoning, response_id=response.id)
