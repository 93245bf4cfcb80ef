"""Call strategies: one model call, with the timeouts a socket cannot give.

A read timeout on the socket cannot detect a stalled model: requests' read
timeout is per socket read, so every keep-alive comment (``: ping``) resets
it, and a model that only sends keep-alives would never time out.  So the
idle timer lives where chunks are *read*, after parsing, and only a
meaningful chunk (content, reasoning, a tool-call delta, the completion)
resets it:

``StreamingCallStrategy``
    The driving thread iterates the client's stream itself: a chunk crosses
    no thread boundary here.  :meth:`CallStrategy.stream_call` is a
    generator: where the client would block it yields a
    :class:`~streamengine._wait.Wait`, which this strategy tightens
    to its two deadlines (idle, which the consumer's time does not use up,
    and the cap) before passing it up to the run's one selector; when the
    wait comes back past a deadline, the call's :class:`CancelToken` is set
    (the client shuts its socket down) and the timeout below is raised.  A
    client that blocks in its reads is read on a worker by its default
    ``open_stream`` (``_wait.on_worker``): its waits are the same.  A
    caller's cancel or an error in ``on_chunk`` sets the token too.
``BufferedCallStrategy``
    For clients that cannot stream: ``client.complete()`` runs in a worker
    thread and the call waits (a ``Wait`` without a socket, woken by the
    worker) up to ``completion_timeout``.

``stream_call()`` is the one way to call: a generator of waits that returns
the response (``_wait.drive`` runs it in the calling thread).

A call is all or nothing: a stream that breaks before its completing chunk
raises and returns no partial content (``on_chunk`` may already have seen
chunks; what to do with them is the engine's business).

Timeout messages (``N``/``M`` formatted with ``:g``; ``M`` counts meaningful
chunks), raised as :class:`LlmTimeoutError` with ``timeout_s``,
``chunks_received`` and ``verb``, chained from what the read raised:

* no meaningful chunk yet (idle timer or cap):
  ``LLM streaming: no response received within Ns (model may be unavailable or overloaded)`` — ``unavailable``
* some, then silence:
  ``LLM streaming idle timeout: no meaningful chunk received for Ns (after M chunks)`` — ``timed out``
* the cap reached while chunks flow:
  ``LLM streaming completion timeout: stream exceeded the Ns cap (after M chunks)`` — ``timed out``
* buffered:
  ``LLM buffered completion timeout: no response received within Ns (model may be unavailable or overloaded)``
  — ``unavailable``
"""
from __future__ import annotations

import abc
import threading
import time
from typing import Any, Callable, Dict, Generator, Iterable, Iterator, List, Optional, Sequence, Union

from .. import _validation as validation
from .._accumulate import ResponseAggregator
from .._cancel import CancelToken, cancel_flag, on_cancel
from .._clients.base import LlmClient, StreamingLlmClient
from .._config import DEFAULT_COMPLETION_TIMEOUT_S, OutputLimits
from .._errors import ConfigError, LlmCancelledError, LlmStreamError, LlmTimeoutError
from .._logs import component_logger
from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolCall, ToolCallDelta, ToolSpec
from .._wait import Flag, Wait
from .hooks import ModelChunkEvent, check_observers, notify_observers

OnChunk = Callable[[Chunk], None]
#: Native tool calls that became complete with a chunk (the call's one accumulator found them).
OnToolCalls = Callable[[List[ToolCall]], None]
Steps = Generator[Wait, None, Response]

VERB_UNAVAILABLE = "unavailable"
VERB_TIMED_OUT = "timed out"


class CallStrategy(abc.ABC):
    """One model call with timeouts: ``stream_call(...)`` returns a Response or raises an :class:`LlmError`.

    ``observers`` hear ``on_llm_responded(response)`` once per successful call
    and ``emitter`` gets a :class:`ModelChunkEvent` per chunk; both run inline
    in the calling thread, so a slow one slows the stream.  ``output_limits``
    (:class:`~streamengine._config.OutputLimits`) caps what one call may
    send; crossing a cap raises :class:`LlmOutputLimitError` (a stream is ended at once).
    """

    #: How long to wait for a worker thread to end once cancelled (buffered): a
    #: client that honours ``cancel`` ends at once; one that does not is abandoned
    #: (the thread is a daemon) with a warning.  Streaming: a stream that returns
    #: later than this after its timeout fired is warned about.
    join_timeout: float = 2.0

    def __init__(self, client: LlmClient, *, completion_timeout: float = DEFAULT_COMPLETION_TIMEOUT_S,
                 observers: Iterable[Any] = (),
                 emitter: Any = None, logger: Any = None, output_limits: Optional[OutputLimits] = None) -> None:
        if not isinstance(client, LlmClient):
            raise ConfigError(
                f"a call strategy needs an LlmClient (e.g. OpenAICompatibleClient(base_url)), "
                f"got {type(client).__name__}")
        self.client = client
        self.completion_timeout = validation.seconds(completion_timeout, "completion_timeout")
        self.observers = check_observers(observers)
        if emitter is not None and not (callable(getattr(emitter, "emit", None)) and hasattr(emitter, "subscribers")):
            raise ConfigError(f"emitter must have an emit(event) method and a subscribers tuple (an EventEmitter), "
                              f"got {emitter!r}")
        self.emitter = emitter
        self.output_limits = output_limits if output_limits is not None else OutputLimits()
        self._log = component_logger(f"streamengine._calls.strategies.{type(self).__name__}", logger)

    @abc.abstractmethod
    def stream_call(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None,
                    on_chunk: Optional[OnChunk] = None, on_tool_calls: Optional[OnToolCalls] = None) -> Steps:
        """Call the model once: yield a :class:`Wait` wherever it would block, return the whole response.

        ``on_chunk(chunk)`` runs in the driving thread for every chunk as it is
        read; ``on_tool_calls(calls)`` for the native tool calls a chunk
        completed (the rest are in the response).  ``cancel`` (a plain Event
        or a :class:`CancelToken`) aborts the call with :class:`LlmCancelledError`.
        """

    def _succeeded(self, response: Response, final_chunk: Chunk) -> None:
        if self.emitter is not None and self.emitter.subscribers:
            self.emitter.emit(ModelChunkEvent(final_chunk, True, response))
        if self.observers:
            notify_observers(self.observers, response, self._log)

    def _stop_worker(self, worker: threading.Thread, token: CancelToken) -> None:
        """Cancel and join a worker thread, bounded; warn if a client ignores cancel."""
        if not worker.is_alive():
            return
        token.set()
        worker.join(self.join_timeout)
        if worker.is_alive():
            self._log.warning(
                "{} still running {:g}s after cancel: the client ignores cancel; thread abandoned (daemon)",
                worker.name, self.join_timeout)


def refuse_if_cancelled(cancel: Optional[threading.Event]) -> None:
    """A call whose caller cancelled already never starts."""
    if cancel is not None and cancel.is_set():
        raise LlmCancelledError("LLM call cancelled by the caller before it started")


def _model_of(options: Optional[CompletionOptions]) -> str:
    return (options.model if options is not None else None) or "(default model)"


def _describe_exception(exc: Optional[BaseException]) -> str:
    """``Type: message`` plus the inner exception, for a log line."""
    if exc is None:
        return "nothing (the read had not failed)"
    text = f"{type(exc).__name__}: {exc}"
    inner = exc.__cause__ or exc.__context__
    if inner is not None:
        text += f" (inner: {type(inner).__name__}: {inner})"
    return text


def _close(stream: Iterator[Any]) -> None:
    """End a client's generator now, so its ``finally`` releases the connection in this thread."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()


# ----------------------------------------------------------------------------- streaming

class StreamingCallStrategy(CallStrategy):
    """Streams a call, with an idle timer (meaningful chunks only) and an absolute cap.

    ``idle_timeout``: the longest silence allowed between meaningful chunks
    (and before the first).  ``completion_timeout``: the cap on the whole
    stream, whatever arrives.  See the module docstring for the messages.
    """

    def __init__(self, client: StreamingLlmClient, *, idle_timeout: float = 30.0,
                 completion_timeout: float = DEFAULT_COMPLETION_TIMEOUT_S,
                 observers: Iterable[Any] = (), emitter: Any = None, logger: Any = None,
                 output_limits: Optional[OutputLimits] = None) -> None:
        super().__init__(client, completion_timeout=completion_timeout, observers=observers,
                         emitter=emitter, logger=logger, output_limits=output_limits)
        if not isinstance(client, StreamingLlmClient):
            raise ConfigError(
                f"StreamingCallStrategy needs a StreamingLlmClient; {type(client).__name__} cannot stream — "
                "use BufferedCallStrategy or make_call_strategy()")
        self.idle_timeout = validation.seconds(idle_timeout, "idle_timeout")

    def stream_call(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None,
                    on_chunk: Optional[OnChunk] = None, on_tool_calls: Optional[OnToolCalls] = None) -> Steps:
        refuse_if_cancelled(cancel)
        token = CancelToken()
        stop_following = on_cancel(cancel, token.set)
        started = time.monotonic()
        client: StreamingLlmClient = self.client  # type: ignore[assignment]
        watched = _Deadlines(token, self.idle_timeout, started, self.completion_timeout)
        try:
            response = yield from self._read(watched, cancel, lambda: client.open_stream(
                messages, tools, options, cancel=token), options, on_chunk, on_tool_calls, started)
        except _Stopped as stopped:
            inner = stopped.__cause__
            raise self._stop_error(stopped, options, started, inner) from inner
        finally:
            stop_following()
        if self.observers:
            notify_observers(self.observers, response, self._log)
        return response

    def _read(self, watched: _Deadlines, cancel: Optional[threading.Event],
              open_stream: Callable[[], Iterator[Union[Chunk, Wait]]], options: Optional[CompletionOptions],
              on_chunk: Optional[OnChunk], on_tool_calls: Optional[OnToolCalls], started: float) -> Steps:
        """Read a chunk, feed it on, move the idle deadline; pass each wait up, tightened to the deadlines.

        Each wait comes back with plain comparisons and attribute reads
        (``CancelToken.cancelled``); only a passed deadline or a cancel calls
        further: bench section 14 counts the calls this saves a token.
        """
        monotonic = time.monotonic
        aggregator = ResponseAggregator(self.output_limits)
        emitter = self.emitter
        token = watched.token
        caller = cancel_flag(cancel)

        def stopped() -> bool:
            return token.is_set() or (cancel is not None and cancel.is_set())

        cap = watched.cap_deadline
        meaningful = 0
        completed = False
        stream: Iterator[Union[Chunk, Wait]] = iter(())
        try:
            stream = open_stream()  # a client may connect here already: inside, so a timeout is told as one
            for chunk in stream:
                if chunk.__class__ is Wait:
                    wait: Wait = chunk
                    if wait.until > cap:
                        wait.until = cap
                    wait.idle_until = watched.idle_deadline
                    wait.held = 0.0
                    yield wait
                    if wait.held:  # the consumer held the thread: not the model's silence
                        watched.idle_deadline += wait.held
                    now = monotonic()
                    if ((now >= watched.idle_deadline or now >= cap or token.cancelled or caller.cancelled)
                            and (_lapsed(watched, now) or stopped())):
                        raise _Stopped(watched.fired or _Stopped.CANCELLED, meaningful, aggregator.chunks)
                    continue
                if token.cancelled:  # timed out or cancelled while this chunk was read: feed no more on
                    raise _Stopped(watched.fired or _Stopped.CANCELLED, meaningful, aggregator.chunks)
                if chunk.is_meaningful:  # type: ignore[union-attr]
                    meaningful += 1
                    watched.idle_deadline = monotonic() + self.idle_timeout
                calls = aggregator.add(chunk)  # type: ignore[arg-type]
                if on_chunk is not None:
                    on_chunk(chunk)  # type: ignore[arg-type]
                if calls and on_tool_calls is not None:
                    on_tool_calls(calls)
                if chunk.is_completed:  # type: ignore[union-attr]
                    completed = True
                    response = aggregator.response()
                    if emitter is not None and emitter.subscribers:
                        emitter.emit(ModelChunkEvent(chunk, True, response))  # type: ignore[arg-type]
                    self._log.debug("stream of model {} completed in {:.3f}s: {} chunks, {} meaningful",
                                    response.model or _model_of(options), monotonic() - started,
                                    aggregator.chunks, meaningful)
                    return response
                if emitter is not None and emitter.subscribers:
                    emitter.emit(ModelChunkEvent(chunk))  # type: ignore[arg-type]
            if stopped():  # a client that ends quietly when cancelled
                raise _Stopped(watched.fired or _Stopped.CANCELLED, meaningful, aggregator.chunks)
            raise LlmStreamError(
                f"LLM stream ended without a completed chunk after {meaningful} meaningful chunks "
                "(no finish reason or [DONE]); the answer is incomplete and was discarded")
        except _Stopped:
            raise
        except BaseException as exc:
            # The read failed because the token was set, or ran into a deadline (its socket timeout): say why.
            if stopped() or _lapsed(watched, monotonic()):
                raise _Stopped(watched.fired or _Stopped.CANCELLED, meaningful, aggregator.chunks) from exc
            raise
        finally:
            if not completed:
                watched.token.set()  # a client still holding its connection shuts it down
            _close(stream)

    def _stop_error(self, stopped: _Stopped, options: Optional[CompletionOptions], started: float,
                    inner: Optional[BaseException]) -> Exception:
        """The exception for a call the reader stopped: cancelled by the caller, or a timeout."""
        waited = time.monotonic() - started
        meaningful = stopped.meaningful
        if stopped.kind == _Stopped.CANCELLED:
            self._log.debug("call to model {} cancelled by the caller after {:.3f}s", _model_of(options), waited)
            return LlmCancelledError(
                f"LLM call cancelled by the caller after {waited:.3f}s ({meaningful} meaningful chunks received)")
        if meaningful == 0:
            limit = self.completion_timeout if stopped.kind == _Stopped.CAP else self.idle_timeout
            message = (f"LLM streaming: no response received within {limit:g}s "
                       "(model may be unavailable or overloaded)")
            verb = VERB_UNAVAILABLE
        elif stopped.kind == _Stopped.CAP:
            limit = self.completion_timeout
            message = (f"LLM streaming completion timeout: stream exceeded the {limit:g}s cap "
                       f"(after {meaningful:g} chunks)")
            verb = VERB_TIMED_OUT
        else:
            limit = self.idle_timeout
            message = (f"LLM streaming idle timeout: no meaningful chunk received for {limit:g}s "
                       f"(after {meaningful:g} chunks)")
            verb = VERB_TIMED_OUT
        self._log.warning(
            "{} — model {}, after {:.3f}s, {} meaningful chunks ({} in all); transport: {}",
            message, _model_of(options), waited, meaningful, stopped.total, _describe_exception(inner))
        return LlmTimeoutError(message, timeout_s=limit, chunks_received=meaningful, verb=verb)


class _Stopped(Exception):
    """Internal: the reader stopped the call (never escapes ``call()``)."""

    CANCELLED, IDLE, CAP = "cancelled", "idle", "cap"

    def __init__(self, kind: str, meaningful: int, total: int) -> None:
        super().__init__(kind)
        self.kind = kind
        self.meaningful = meaningful
        self.total = total


class _Deadlines:
    """One call's two deadlines (monotonic), its token, and which deadline fired (None: neither yet)."""

    __slots__ = ("cap_deadline", "fired", "idle_deadline", "token")

    def __init__(self, token: CancelToken, idle_s: float, started: float, cap_s: float) -> None:
        self.token = token
        self.idle_deadline = started + idle_s
        self.cap_deadline = started + cap_s
        self.fired: Optional[str] = None


def _lapsed(watched: _Deadlines, now: float) -> bool:
    """Whether the cap or the idle deadline passed; records which (the cap wins)."""
    if watched.fired is None:
        if now >= watched.cap_deadline:
            watched.fired = _Stopped.CAP
        elif now >= watched.idle_deadline:
            watched.fired = _Stopped.IDLE
        else:
            return False
    return True


# ----------------------------------------------------------------------------- factory

def make_call_strategy(client: LlmClient, *, idle_timeout: float = 30.0,
                       completion_timeout: float = DEFAULT_COMPLETION_TIMEOUT_S,
                       observers: Iterable[Any] = (), emitter: Any = None, logger: Any = None,
                       output_limits: Optional[OutputLimits] = None) -> CallStrategy:
    """Pick the strategy by capability, once: streaming if the client can stream."""
    if isinstance(client, StreamingLlmClient):
        return StreamingCallStrategy(client, idle_timeout=idle_timeout, completion_timeout=completion_timeout,
                                     observers=observers, emitter=emitter, logger=logger, output_limits=output_limits)
    validation.seconds(idle_timeout, "idle_timeout")  # validated even if unused, so a typo never hides
    return BufferedCallStrategy(client, completion_timeout=completion_timeout, observers=observers,
                                emitter=emitter, logger=logger, output_limits=output_limits)


# --- The call strategy for clients that cannot stream: ``complete()`` on a worker, waited for without blocking. ----
# So that the engine handles both strategies alike, a successful call hands
# ``on_chunk`` one synthesized completed chunk with the whole answer (see
# :class:`BufferedCallStrategy`).  The wait is a :class:`Wait` without a
# socket that the worker ends (``Wait.wake``), so the run's loop goes on
# meanwhile (tool results, heartbeats, a cancel).

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
        box: Dict[str, Any] = {}

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

    def _outcome(self, box: Dict[str, Any], cancelled: bool, finished: bool, options: Optional[CompletionOptions],
                 started: float) -> Response:
        waited = time.monotonic() - started
        error = box.get("error")
        if cancelled:
            raise LlmCancelledError(f"LLM call cancelled by the caller after {waited:.3f}s") from error
        if "response" in box:
            response: Response = box["response"]
            return response
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
                 refusal=response.refusal, reasoning=response.reasoning, response_id=response.id,
                 provider_items=response.provider_items)
