"""What a client may learn of a failure, and the response iterable that writes a run's frames (``_frames``).

What a client may learn about a failure: a short message and a request id; details go to the log.

One stream's response iterable: engine events in, batched SSE bytes out, ``close()`` cancels.

Why it is built this way:

* **One socket write per batch.**  The engine is driven by the server's
  thread iterating this response, and hands events over in lists
  (``Run.batches`` of ``StreamingEngine.run``): each list is what was ready before the
  run would wait (everything one read of the provider produced, a tool's
  result).  Writing a frame per token costs a server write call and a send
  syscall per token; joining a list's frames costs one of each, and since a
  list ends where the run would wait, no token waits for the next one.  A
  batch is also sent when it reaches ``MAX_BATCH_BYTES``.
* **A disconnect must cancel the run.**  PEP 3333 servers call ``close()``
  when the client has gone away (or after the last frame); it closes the
  event generator, which shuts the provider's socket down, cancels the tools
  and ends the run's threads.  A server only *notices* a disconnect when a
  write fails, so ``: ping`` goes out every ``heartbeat_s`` while the run is
  silent; under waitress the ``waitress.client_disconnected`` probe is also
  polled a few times a second.
* **A reader that stays stuck is cancelled.**  The run goes only as fast as
  the server's writes, so a client that reads nothing stops the run from
  reading the provider (memory stays bounded by the socket buffers); but the
  run would still hold a provider connection and tools.  :class:`StuckReaders` watches every open stream: one
  whose last batch has been in the server's hands (a blocked socket write)
  for ``stuck_reader_timeout_s`` is cancelled, and its connection dropped.
* **Cancelling is not enough for a stuck reader.**  The server's thread is
  blocked in its write for as long as the client's kernel acknowledges
  zero-window probes, which is for ever: the thread and the client's stream
  slot would stay taken (seven addresses held every slot of a default
  ``serve``).  So the connection is reset (``SO_LINGER`` 0, then
  ``shutdown``) where the server shows its socket: waitress's channel (whose
  method the disconnect probe is) or ``gunicorn.socket``.  The blocked write
  then fails, the server closes the response, and the slot is released.
"""
from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ClassVar,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypedDict,
    cast,
)

from .._cancel import CancelToken
from .._engine.events import DoneEvent, Event, HeartbeatEvent, TokenEvent
from .._errors import StreamEngineError
from .._inline import BlockFilter
from .._logs import component_logger
from .._messages import LLM_WARNING, Message, ToolCall
from ._frames import (
    DONE_FRAME,
    OK_FRAME,
    PING_FRAME,
    done_frame,
    encode_event,
    encode_token,
    named_frame,
    tool_result_frame,
)
from ._guard import Watched

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment
    from loguru import Logger

#: A batch is written when it reaches this size, whatever is still to come in it.
MAX_BATCH_BYTES = 64 * 1024


_log = component_logger("streamengine.web._sse")


class RunOptions(TypedDict, total=False):
    """What the app adds to a request's run: its ``approve`` hook and its RAG scope."""

    approve: Callable[[ToolCall], object]
    conversation_id: Optional[str]


class EngineLike(Protocol):
    """What the web layer needs of an engine: a :class:`~streamengine.StreamingEngine`, or one of your own.

    Only ``run()`` is needed; when what it returns has ``batches()`` (a ``StreamingEngine``'s
    :class:`~streamengine.Run`), the response reads those, so each burst of events is one socket write.  The
    app's :class:`RunOptions` are passed only when it has them: ``run()`` takes
    ``conversation_id=`` for an app with ``scope=``, ``approve=`` for one with ``approve=``.
    """

    def run(self, messages: Sequence[Message], cancel: threading.Event, /, *,
            heartbeat_s: Optional[float] = ...) -> Iterator[Event]: ...

def encode_stream(events: Iterable[Event], *, ok_first: bool = True,
                  errors: Optional[PublicErrors] = None) -> Iterator[bytes]:
    """``OK_FRAME``, one frame per event in order, and ``DONE_FRAME`` last — always.

    If ``events`` (or encoding one of them) raises an ``Exception``, the error is
    logged with its traceback and the stream ends with an ``event: error`` frame
    followed by ``DONE_FRAME`` instead of re-raising.  Why: by then the HTTP 200
    and part of the body are sent; an exception would only make the server drop
    the connection, and the browser would see neither an error nor the end (and
    ``EventSource`` would reconnect, replaying the request).  A
    :class:`StreamEngineError`'s message is user-facing by design and is sent;
    any other exception is a bug whose text may hold internals, so only its
    type is sent.

    Closing the returned generator (a WSGI server calls ``close()`` when the
    client goes away) closes ``events`` too, so the engine's run is cancelled;
    nothing more is yielded then.

    With ``errors`` (a :class:`PublicErrors`), error details stay in the
    server log and the client gets a short message and a request id.
    """
    return frames(one_by_one(iter(events)), 0.0, None, errors, ok_first)


class Framer(Protocol):
    """Another protocol's frames on the same stream machinery (the AI SDK's UI message stream, AG-UI).

    :func:`frames` keeps the batching, heartbeats and disconnect checks, and
    asks the framer for every frame but ``: ping``.  A framer is a state
    machine for one stream: ``token`` is the hot path, ``failure`` ends a
    stream whose events raised, and ``closing`` is always written last (it
    ends a stream that stopped without its terminal event, too).
    """

    def opening(self) -> bytes: ...

    def token(self, text: str) -> bytes: ...

    def encode(self, event: Event) -> bytes: ...

    def failure(self, exc: BaseException) -> bytes: ...

    def closing(self) -> bytes: ...


def result_call(event: object, result: object, call_id: str) -> ToolCall:
    """The call a ``tool_result`` answers: its event's, or (a logged result has none) one named by the result."""
    call = getattr(event, "call", None)
    return call if isinstance(call, ToolCall) else ToolCall(call_id, str(getattr(result, "name", "")), "")


def held_call(event: object) -> Optional[ToolCall]:
    """The call an ``approval_request`` holds (its logged ``{"id", "name", "arguments"}``); None without an id."""
    raw = getattr(event, "call", None)
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        return None
    return ToolCall(raw["id"], str(raw.get("name")), str(raw.get("arguments") or ""))


class EventFramer:
    """What the frontends' framers share: the text of a token a client may see, and events dispatched by name.

    A token starting with the engine's warning has its detail made public;
    any other has its inline tool blocks left out (the call is shown on its
    own card).  A subclass writes :meth:`_text_delta` (a visible token's
    frame) and ``_HANDLERS`` (every other event it has a frame for); after
    ``_ended`` nothing more is written.
    """

    _HANDLERS: ClassVar[Dict[str, Callable[[Any, object], bytes]]] = {}

    def __init__(self, errors: PublicErrors) -> None:
        self._errors = errors
        self._prose = BlockFilter()
        self._ended = False

    def token(self, text: str) -> bytes:
        if self._ended or not text:
            return b""
        if text.startswith(self._errors.token_prefix):
            text = self._errors.token_text(text)
        else:
            text = self._prose.feed(text)
            if not text:
                return b""
        return self._text_delta(text)

    def _text_delta(self, text: str) -> bytes:
        raise NotImplementedError

    def encode(self, event: object) -> bytes:
        if self._ended:
            return b""
        name = getattr(event, "name", None)
        if name == "token":
            return self.token(getattr(event, "text", ""))
        handler = self._HANDLERS.get(name) if isinstance(name, str) else None
        return handler(self, event) if handler is not None else b""  # an event this protocol has no frame for


def frames(batches: Iterator[List[Event]], heartbeat_s: Optional[float], disconnected: Optional[Callable[[], bool]],
           errors: Optional[PublicErrors], ok_first: bool = True,
           framer: Optional[Framer] = None) -> Generator[bytes, None, None]:
    """``: ok``, then the frames of each list of events joined, ``data: [DONE]`` in the last one.

    The one framer of both paths: the app's streams (one list per burst the
    run hands over, written as one socket write) and :func:`encode_stream`
    for a framework's view (one event a list).  With ``framer``, that
    protocol's frames instead (see :class:`Framer`).

    Heartbeats from the engine come more often than the wire needs pings (so
    the disconnect probe is read a few times a second); a ping is written
    only after ``heartbeat_s`` without a write.
    """
    encode: Callable[[Event], bytes] = errors.encode if errors is not None else encode_event
    token: Callable[[str], bytes] = encode_token
    # Tokens that ``errors`` renders its own way start with this (all of them, "", for an ``errors``
    # that does not say); any other token is encode_token's, sent without asking.
    special = getattr(errors, "token_prefix", "") if errors is not None else None
    if framer is not None:
        encode, token, special = framer.encode, framer.token, None
    monotonic = time.monotonic
    opening = framer.opening() if framer is not None else OK_FRAME if ok_first else b""
    if opening:
        yield opening
    last_write = monotonic()
    parts: List[bytes] = []
    try:
        try:
            for batch in batches:
                if len(batch) == 1 and batch[0].__class__ is TokenEvent:  # one token a read: the hot path
                    text = batch[0].text
                    if special is None or not text.startswith(special):
                        yield token(text)
                        last_write = monotonic()
                        continue
                size = 0
                beat = False
                for event in batch:
                    if event.__class__ is TokenEvent and (special is None or not event.text.startswith(special)):
                        frame = token(event.text)  # tokens of a burst: no dispatch by name either
                    elif event.__class__ is HeartbeatEvent:
                        beat = True
                        continue
                    else:
                        frame = encode(event)
                    parts.append(frame)
                    size += len(frame)
                    if size >= MAX_BATCH_BYTES:
                        yield b"".join(parts)
                        parts, size = [], 0
                if batch and isinstance(batch[-1], DoneEvent):
                    break  # the last event: sent with [DONE] below, in the same write
                if parts:
                    yield b"".join(parts)
                    parts = []
                elif beat:
                    if disconnected is not None and disconnected():
                        return
                    if heartbeat_s is None or monotonic() - last_write < heartbeat_s:
                        continue
                    yield PING_FRAME
                else:
                    continue
                last_write = monotonic()
        except Exception as exc:
            parts.append(framer.failure(exc) if framer is not None else failure_frame(exc, errors))
        parts.append(framer.closing() if framer is not None else DONE_FRAME)
        yield b"".join(parts)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def one_by_one(events: Iterator[Event]) -> Iterator[List[Event]]:
    try:
        for event in events:
            yield [event]
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def failure_frame(exc: BaseException, errors: Optional[PublicErrors]) -> bytes:
    """The ``event: error`` frame ending a stream whose events raised (the traceback goes to the log)."""
    if errors is not None:
        return errors.failure(exc)
    _log.opt(exception=exc).error("event stream failed; ending it with an error frame: {}", exc)
    return named_frame(b"event: error\ndata: ", {"message": _public_message(exc)})


def _public_message(exc: BaseException) -> str:
    if isinstance(exc, StreamEngineError):
        return str(exc) or type(exc).__name__
    return f"internal error ({type(exc).__name__}); see the server log"


_public_log = component_logger("streamengine.web")


class PublicErrors:
    """What a client may learn about failures: a short message and a request id, details to the log.

    Error texts carry provider URLs, status bodies, exception reprs and tool
    tracebacks; none of that belongs in a stranger's browser.  Each detail is
    logged (loguru, ``streamengine`` logger) under ``request_id``, which the
    client sees, so an operator can find it.  ``expose=True`` (development)
    sends the details as well.  Covers ``event: error``, a failed tool's
    ``error``, the engine's visible ``LLM error`` token and the answer in
    ``event: done`` that repeats it, and ``telemetry.failed_attempts`` there
    (only the model and the error's type).
    """

    #: Tokens :meth:`encode` rewrites start with this (the engine's visible warning); the framer
    #: sends any other token as it is, without asking.
    token_prefix = LLM_WARNING

    def __init__(self, request_id: str, *, expose: bool = False, logger: Optional[Logger] = None) -> None:
        self.request_id = request_id
        self.expose = expose
        self._log = logger if logger is not None else _public_log
        self._warnings: List[Tuple[str, str]] = []  # (warning token as sent by the engine, what the client got)

    def public(self, what: str, detail: object) -> str:
        """Log ``detail`` under the request id; the text the client gets instead."""
        self._log.warning("request {}: {}: {}", self.request_id, what, detail)
        if self.expose:
            return f"{detail} (request id {self.request_id})"
        return f"{what} (request id {self.request_id}; details are in the server log)"

    def encode(self, event: Event) -> bytes:
        name = getattr(event, "name", None)
        if name == "token":
            text = getattr(event, "text", None)
            if isinstance(text, str) and text.startswith(self.token_prefix):
                return encode_token(self._warning(text))
            return encode_token(cast(str, text))  # a non-str: encode_token's TypeError names it
        special = self._SPECIAL.get(name) if isinstance(name, str) else None
        return special(self, event) if special is not None else encode_event(event)

    def _warning(self, text: str) -> str:
        shown = LLM_WARNING + self.public("the model request failed", text[len(LLM_WARNING):])
        self._warnings.append((text, shown))
        return shown

    def token_text(self, text: str) -> str:
        """A token as the client may see it: the engine's visible warning has its detail replaced."""
        return self._warning(text) if text.startswith(self.token_prefix) else text

    def error_text(self, event: object) -> str:
        """An ``error`` event's message as the client may see it."""
        fatal = getattr(event, "fatal", True)
        what = "the answer failed" if fatal else "a problem the answer went on past"
        return self.public(what, getattr(event, "message", None))

    def tool_error_text(self, result: object, skipped: object) -> object:
        """A tool result's error as the client may see it (None when it has none)."""
        error = getattr(result, "error", None)
        if not error:
            return error
        what = (f"not run ({skipped})" if skipped else
                "the tool timed out" if getattr(result, "timed_out", False) else "the tool failed")
        return self.public(f"{what}: {getattr(result, 'name', '?')}", error)

    def answer_text(self, answer: object) -> object:
        """The run's answer as the client may see it: the warning tokens it repeats, replaced as they were."""
        if isinstance(answer, str):
            for warning, shown in self._warnings:
                answer = answer.replace(warning, shown)
        return answer

    def telemetry(self, telemetry: object) -> object:
        """The run's telemetry as the client may see it: which model failed and how, not what it said."""
        failures = getattr(telemetry, "failed_attempts", None)
        if failures and telemetry is not None and not self.expose:
            return dataclasses.replace(cast(Any, telemetry), failed_attempts=[
                ": ".join(line.split(": ", 2)[:2]) for line in failures])
        return telemetry

    def failure_text(self, exc: BaseException) -> str:
        """What the client learns of an exception that ended its stream (the traceback goes to the log)."""
        self._log.opt(exception=exc).error("request {}: event stream failed: {}", self.request_id, exc)
        return f"{_public_message(exc)} (request id {self.request_id})" if self.expose else \
            f"the answer failed (request id {self.request_id}; details are in the server log)"

    def _error(self, event: object) -> bytes:
        return named_frame(b"event: error\ndata: ", {"message": self.error_text(event),
                                                       "fatal": getattr(event, "fatal", True),
                                                       "request_id": self.request_id})

    def _tool_result(self, event: object) -> bytes:
        result = getattr(event, "result", None)
        skipped = getattr(event, "skipped", None)
        return tool_result_frame(result, self.tool_error_text(result, skipped), skipped)

    def _done(self, event: object) -> bytes:
        result = getattr(event, "result", None)
        return done_frame(result, self.answer_text(getattr(result, "answer", None)),
                          self.telemetry(getattr(result, "telemetry", None)))

    def failure(self, exc: BaseException) -> bytes:
        return named_frame(b"event: error\ndata: ", {"message": self.failure_text(exc),
                                                       "request_id": self.request_id})

    _SPECIAL: ClassVar[Dict[str, Callable[[PublicErrors, object], bytes]]] = {
        "error": _error, "tool_result": _tool_result, "done": _done,
    }


#: A batch is written once it is this large, however many events are still waiting.
#: How often an idle stream asks the server whether its client is gone (waitress); one attribute read.
PROBE_S = 0.25

Probe = Callable[[], bool]
_monotonic = time.monotonic


class SseResponse:
    """The response iterable of one stream: batches out, and ``close()`` cancels the run.

    ``close()`` may come from the server after the last frame, after a failed
    write (the client went away), or from another thread while a batch is
    being produced; in the last case generator ``close()`` is not allowed, so
    the run is stopped through its cancel token, which works from any thread.
    """

    def __init__(self, engine: EngineLike, messages: Sequence[Message], *, heartbeat_s: Optional[float],
                 disconnected: Optional[Probe] = None, on_close: Optional[Callable[[], None]] = None,
                 errors: Optional[PublicErrors] = None, logger: Optional[Logger] = None,
                 run_options: Optional[RunOptions] = None,
                 drop_connection: Optional[Callable[[], None]] = None, framer: Optional[Framer] = None) -> None:
        self.cancel = CancelToken()
        self._drop = drop_connection
        tick = heartbeat_s
        if disconnected is not None:
            tick = PROBE_S if heartbeat_s is None else min(heartbeat_s, PROBE_S)
        # run() checks the messages and the engine eagerly: a ConfigError here is still a 4xx/5xx.
        extra: RunOptions = run_options or {}
        start: Callable[..., Iterator[Event]] = engine.run  # it takes the options the app has (see EngineLike)
        run = start(messages, self.cancel, heartbeat_s=tick, **extra)
        # A StreamingEngine's Run hands events over in lists; an engine of your own whose run() gives events only:
        # one event a batch.
        batched = getattr(run, "batches", None)
        batches: Iterator[List[Event]] = batched() if callable(batched) else one_by_one(run)
        self._batches = frames(batches, heartbeat_s, disconnected, errors, framer=framer)
        self._progress = _Progress()
        # A generator over the frames and the progress only, never the response: no reference cycle,
        # so a response dropped without close() frees its run at once.
        self._writes = _write_each(self._batches, self._progress)
        self._on_close = on_close
        self._log = logger if logger is not None else component_logger("streamengine.web.SseResponse")
        self._started = time.monotonic()

    @property
    def writing_since(self) -> Optional[float]:
        """Since when (monotonic) a batch is in the server's hands; None while none is."""
        return self._progress.writing_since

    def __iter__(self) -> Iterator[bytes]:
        return self._writes  # a generator: the server's next() per write calls no Python method

    def __next__(self) -> bytes:
        return next(self._writes)

    def give_up(self) -> None:
        """The client took nothing for too long: cancel the run and drop the connection (from any thread).

        The server's thread is blocked writing to that client, so the run's end
        could never be written; dropping the connection makes that write fail,
        and the server then closes this response.  Without ``drop_connection``
        (a server that does not show its socket) only the run is cancelled.
        """
        self.cancel.set()
        drop, self._drop = self._drop, None
        if drop is not None and not self._progress.closed:
            drop()

    def close(self) -> None:
        """End the run (if still going) and free everything it holds; idempotent."""
        progress = self._progress
        self._drop = None
        if progress.closed:
            return
        progress.closed = True
        progress.writing_since = None
        if not progress.finished:
            self._log.info("stream closed by the server after {} writes and {:.3f}s (client gone?); "
                           "cancelling the run", progress.sent, time.monotonic() - self._started)
            self.cancel.set()
        try:
            for generator in (self._writes, self._batches):  # the first closes the second, once started
                try:
                    generator.close()
                except ValueError:  # being iterated in another thread: the cancel token ends that run
                    pass
        finally:
            on_close, self._on_close = self._on_close, None  # it refers back to this response: no cycle left
            if on_close is not None:
                on_close()


class _Progress:
    """What one response's writes have got to; shared by the response and its generator of writes."""

    __slots__ = ("closed", "finished", "sent", "writing_since")

    def __init__(self) -> None:
        self.writing_since: Optional[float] = None  # a batch is in the server's hands since then
        self.sent = 0
        self.finished = False
        self.closed = False


def _write_each(batches: Generator[bytes, None, None], progress: _Progress) -> Generator[bytes, None, None]:
    """The batches, one per server write, with ``progress`` kept up to date."""
    if not progress.closed:
        for batch in batches:
            if progress.closed:
                break
            progress.sent += 1
            progress.writing_since = _monotonic()
            yield batch
            progress.writing_since = None
            if progress.closed:
                break
        else:
            progress.finished = True
            return
    # Closed, maybe from another thread while a batch was made: finish the generators here,
    # in the iterating thread, where closing them is allowed.
    batches.close()


class StuckReaders:
    """Cancels streams whose client has not taken a write for ``timeout_s`` (one watcher thread per app).

    The thread runs only while streams are open, checks every ``timeout_s / 4``
    and ends when the last stream closes, so an idle app holds no thread.
    """

    def __init__(self, timeout_s: Optional[float], logger: Logger) -> None:
        self.timeout_s = timeout_s
        self._log = logger
        self._streams: set[Watched] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def add(self, response: Watched) -> None:
        if self.timeout_s is None:
            return
        with self._lock:
            self._streams.add(response)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="streamengine-stuck-readers", daemon=True)
                self._thread.start()

    def remove(self, response: Watched) -> None:
        with self._lock:
            self._streams.discard(response)
            if not self._streams:
                self._wake.set()

    def _watch(self) -> None:
        assert self.timeout_s is not None
        while True:
            self._wake.wait(self.timeout_s / 4)
            with self._lock:
                self._wake.clear()
                if not self._streams:
                    self._thread = None
                    return
                streams = list(self._streams)
            now = time.monotonic()
            for response in streams:
                since = response.writing_since
                if since is not None and now - since >= self.timeout_s and not response.cancel.is_set():
                    self._log.warning("a client read nothing for {:.1f}s; cancelling its run and closing its "
                                      "connection (stuck_reader_timeout_s={})", now - since, self.timeout_s)
                    response.give_up()


def connection_dropper(environ: WSGIEnvironment) -> Optional[Callable[[], None]]:
    """A function resetting this request's connection from any thread, or None where the server hides it.

    gunicorn puts the client's socket in ``gunicorn.socket``; waitress's
    ``waitress.client_disconnected`` is a method of its channel, which holds
    the socket (``channel.socket``).
    """
    sock = environ.get("gunicorn.socket")
    if sock is None:
        channel = getattr(environ.get("waitress.client_disconnected"), "__self__", None)
        sock = getattr(channel, "socket", None)
    if not isinstance(sock, socket.socket):
        return None
    return lambda: _reset_socket(sock)


def _reset_socket(sock: socket.socket) -> None:
    """Reset, not close: the unsent answer is dropped at once (a FIN would wait behind it for ever)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)  # wakes the server: its blocked write fails, its loop sees the hang-up
    except OSError:  # already closed by the server: nothing left to drop
        pass
