"""The routes of runs that outlive their connection (``make_wsgi_app(runs=...)``): start, resume, stop, approve.

Routes (relative to the app's mount point)::

    POST /v1/chat/stream                 a new run: X-Run-Id, Location, ``retry:``, ``id: <run>.<seq>`` per frame
    GET  /v1/chat/stream?q=...           the same; with a Last-Event-ID naming a run: resumes it
    GET  /v1/runs/<run_id>/events        the frames after Last-Event-ID (header, or ?last_event_id=)
    GET  /v1/runs/<run_id>               {"run_id", "state", ..., "answer"} as JSON
    POST /v1/runs/<run_id>/stop          202: the run is asked to stop, wherever it runs
    POST /v1/runs/<run_id>/approvals/<call_id>   {"approved": bool, "reason": "..."} (approvals=True)

and, for ``useChat`` (the app's ``/api/chat`` routes call them): a chat run
started with its chat's index (:meth:`RunRoutes.start`), its replay
(:meth:`RunRoutes.resume_chat`) and the answers to its held calls
(:meth:`RunRoutes.answer_chat`).

Why it is built this way:

* **An HTTP response is one reader of the log.**  The response that started
  a run sends what the log accepted (:mod:`._producer`); any other reader,
  on any worker, reads the log from its Last-Event-ID and waits for more.
* **A reader notices a dead producer.**  Its reads wait at most a second,
  and an empty one looks at the run's lease: expired means the producer's
  worker died or froze, and the reader closes the run as ``producer_lost``
  (atomically: a producer that comes back is fenced).
* **One log format, encoded on read.**  A chat run's frames are the app's
  own events; its responses write them through a :class:`Render` (the UI
  message stream for ``useChat``), so a resume on any worker sends what the
  first response sent.
* **A chat's index is a run of the log.**  Its id is a hash of the owner and
  the chat id; its frames name the chat's runs, newest last.  Its lease is
  always out, so the chat's next request takes it over (atomically) to
  append: no store needs a table or key of its own for it.
* **One 404.**  Unknown, expired and another owner's runs get the same body,
  so a run id reveals nothing about whose it is.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
)
from urllib.parse import parse_qs

from .. import _validation as validation
from .._errors import ConfigError
from .._messages import Message
from ..runs import (
    Frame,
    Gap,
    Lease,
    MemoryRunLog,
    RunExistsError,
    RunFencedError,
    RunLog,
    RunLogError,
    RunNotFound,
    RunStatus,
    new_run_id,
)
from ._frames import DONE_FRAME, OK_FRAME, PING_FRAME, SSE_HEADERS
from ._guard import ClientKey, HttpError, StreamLimiter, clip, engine_refusal, json_response, status_line
from ._producer import APPEND_WINDOW_S, RunProducer, detach, error_event, frame_call, frame_object, read_to_end
from ._sse import PROBE_S, EngineLike, PublicErrors, RunOptions, StuckReaders, connection_dropper

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment
    from loguru import Logger

    from ._takeover import Taker

RUNS_PATH = "/v1/runs/"
#: How long a browser waits before it reconnects (the ``retry:`` line of every run's stream).
RETRY_MS = 1000
#: The longest one read of the log waits: a dead producer is noticed within its lease plus this.
READ_WAIT_S = 1.0
#: How often a reader tells the log it is there (a detached run's grace counts from the last time).
MARK_READ_S = 1.0
#: A chat index's lease: always out, so the chat's next request takes the index over (atomically) to append.
CHAT_INDEX_LEASE_S = 0.01
ON_DISCONNECT = ("cancel", "detach")

_LAST_EVENT_ID = re.compile(r"([A-Za-z0-9_-]{8,64})\.([0-9]{1,18})\Z")
_RUN_PATH = re.compile(r"/v1/runs/([A-Za-z0-9_-]{8,64})(/events|/stop|/approvals/([^/]{1,256}))?\Z")
_NOT_FOUND = ("no such run: it never existed, its retention ran out, or it is not yours; "
              "start a new run with POST /v1/chat/stream")

Owner = Callable[["WSGIEnvironment"], object]
Headers = List[Tuple[str, str]]
Response = Tuple[str, Headers, Iterable[bytes]]


def last_event_id(environ: WSGIEnvironment) -> Optional[Tuple[str, int]]:
    """``(run_id, seq)`` from the ``Last-Event-ID`` header, or ``?last_event_id=``; None when neither is sent."""
    raw = environ.get("HTTP_LAST_EVENT_ID")
    if raw is None:
        values = parse_qs(environ.get("QUERY_STRING", "")).get("last_event_id")
        raw = values[0] if values else None
    if raw is None or raw == "":
        return None
    found = _LAST_EVENT_ID.match(raw.strip())
    if found is None:
        raise HttpError("Last-Event-ID must be '<run_id>.<seq>' as this server sent it in an id: line; "
                        "reconnect with the last id you received, or start a new run", field="Last-Event-ID")
    return found.group(1), int(found.group(2))


def frame_bytes(run_id: str, frame: Frame) -> bytes:
    """One log frame as SSE: ``id: <run>.<seq>``, its ``event:`` line (none for a token), its data."""
    event = "" if frame.name == "token" else f"event: {frame.name}\n"
    return f"id: {run_id}.{frame.seq}\n{event}data: {frame.data}\n\n".encode()


def gap_bytes(gap: Gap) -> bytes:
    """``event: gap``: frames after the reader's were trimmed; the status says where the run stands."""
    payload = {"after_seq": gap.after_seq, "next_seq": gap.next_seq, "status": status_payload(gap.status)}
    return b"event: gap\ndata: " + json.dumps(payload, ensure_ascii=True).encode("ascii") + b"\n\n"


def status_payload(status: RunStatus) -> Dict[str, Any]:
    """The JSON of ``GET /v1/runs/<id>``: the state, the seqs, and once ended its terminal (and answer)."""
    payload: Dict[str, Any] = {"run_id": status.run_id, "state": status.state, "first_seq": status.first_seq,
                               "last_seq": status.last_seq, "stop_requested": status.stop_requested}
    terminal = status.terminal
    if terminal is not None:
        data = json.loads(terminal.data)
        payload["terminal"] = {"event": terminal.name, "data": data}
        if terminal.name == "done" and isinstance(data, dict):
            payload["answer"] = data.get("answer")
    return payload


def chat_index_id(owner: str, chat_id: str) -> str:
    """The id of a chat's index in the log: the owner's and the chat's, hashed (43 URL-safe characters)."""
    digest = hashlib.sha256(f"chat-index\0{owner}\0{chat_id}".encode()).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


class ChatRun(NamedTuple):
    """A run that answers a frontend's chat: its chat id, its run meta, its response's protocol and headers."""

    chat_id: str
    meta: Dict[str, Any]
    render: Callable[[str], Render]  # the request id -> how its frames are written
    headers: Headers
    approvals: bool  # whether the protocol can ask about held calls (approvals=True asks only then)




def _note_approval(frame: Frame, held: Dict[str, int], settled: List[str]) -> None:
    """An ``approval_request`` holds its call; the call's ``tool_result`` settles it."""
    data = frame_object(frame)
    if data is None:
        return
    if frame.name == "approval_request":
        call = frame_call(frame, data)
        if call:
            held[call["id"]] = frame.seq
    elif data.get("call_id") in held:
        call_id = data["call_id"]
        del held[call_id]
        settled.append(call_id)


def not_found() -> HttpError:
    return HttpError(_NOT_FOUND, 404)


class Render(Protocol):
    """How a reader writes a run's log frames: the app's own events, or a frontend's protocol (encoded on read)."""

    def head(self) -> bytes:
        """What a response sends first."""

    def frames(self, run_id: str, frames: List[Frame]) -> bytes:
        """Frames as the client's protocol has them (the terminal one included; ``[DONE]`` follows)."""

    def gap(self, gap: Gap) -> bytes:
        """Frames the log trimmed before the reader's next."""

    def error(self, code: str, message: str) -> bytes:
        """A fatal error of the reader's own (the log cannot be read): the stream's last frame but ``[DONE]``."""

    def parked(self) -> bool:
        """The protocol ended its stream before the run's end: a held call, answered in the client's next request."""

    def done(self) -> bytes:
        """What ends the response after its last frame (``data: [DONE]``; AG-UI: nothing)."""


class SseRender:
    """The app's own events: ``retry:`` first, ``id: <run>.<seq>`` on every frame, ``event: gap``."""

    def head(self) -> bytes:
        return b"retry: %d\n\n%s" % (RETRY_MS, OK_FRAME)

    def frames(self, run_id: str, frames: List[Frame]) -> bytes:
        return b"".join(frame_bytes(run_id, frame) for frame in frames)

    def gap(self, gap: Gap) -> bytes:
        return gap_bytes(gap)

    def error(self, code: str, message: str) -> bytes:
        return _error_frame(code, message)

    def parked(self) -> bool:
        return False  # the app's own stream goes on through an approval_request: any reader answers it

    def done(self) -> bytes:
        return DONE_FRAME


#: Makes a chat response's render: (the run's status, calls whose card the client has, calls answered already).
MakeChatRender = Callable[[RunStatus, Sequence[str], Sequence[str]], Render]


class RunRoutes:
    """The run routes of one app over ``log``; the app does its Host, cross-site and authorize checks first."""

    def __init__(self, log: RunLog, *, owner: Optional[Owner], on_disconnect: Optional[str], detach_grace_s: float,
                 lease_s: float, retain_s: float, approvals: bool, max_detached_per_client: int,
                 limiter: StreamLimiter, limiter_key: ClientKey, retry_after_s: int,
                 heartbeat_s: Optional[float], approval_timeout_s: float, stuck: StuckReaders,
                 logger: Logger, append_window_s: float = APPEND_WINDOW_S) -> None:
        if not isinstance(log, RunLog):
            raise ConfigError(f"runs must be a RunLog (MemoryRunLog(), SqliteRunLog(path), RedisRunLog(url), "
                              f"PostgresRunLog(dsn)), got {type(log).__name__}")
        if owner is not None and not callable(owner):
            raise ConfigError(f"owner must be a function environ -> str (the signed-in user), got "
                              f"{type(owner).__name__}")
        if on_disconnect is None:
            on_disconnect = "cancel" if isinstance(log, MemoryRunLog) else "detach"
        if on_disconnect not in ON_DISCONNECT:
            raise ConfigError(f"on_disconnect is 'detach' (the run goes on into the log) or 'cancel', "
                              f"got {on_disconnect!r}")
        self.log = log
        self.on_disconnect = on_disconnect
        self.approvals = bool(approvals)
        self.detach_grace_s = validation.seconds(detach_grace_s, "detach_grace_s")
        self.lease_s = validation.seconds(lease_s, "lease_s")
        self.retain_s = validation.seconds(retain_s, "retain_s")
        self.heartbeat_s = heartbeat_s
        self.append_window_s = validation.seconds(append_window_s, "append_window_s")
        self.approval_timeout_s = approval_timeout_s
        self._owner = owner
        self._limiter = limiter
        self._detached = StreamLimiter(limiter.max_streams, max_detached_per_client, limiter_key, retry_after_s)
        self._retry_after = str(retry_after_s)
        self.stuck = stuck
        self.logger = self._log = logger
        self.taker: Optional[Taker] = None  # set by the app when its runs may be taken over (web._takeover)

    @property
    def detached(self) -> int:
        """Runs of this app driven on after their client went away."""
        return self._detached.active

    def owner_of(self, environ: WSGIEnvironment) -> str:
        """Whose runs this request may see: the ``owner`` hook's answer, or one owner for everyone."""
        if self._owner is None:
            return "anonymous"
        try:
            owner = self._owner(environ)
        except Exception as exc:
            self._log.opt(exception=exc).error("the owner hook failed: {}", exc)
            raise HttpError("the request's owner could not be determined; try again later or ask the operator "
                            "to look at the server log", 500) from exc
        if not isinstance(owner, str) or not owner.strip():
            raise HttpError("not authorized: this request has no owner for its runs (the owner hook returned "
                            f"{type(owner).__name__}); sign in and retry", 401)
        return owner

    def detached_slot(self, environ: WSGIEnvironment) -> Callable[[], None]:
        """A detached run's slot (HttpError over the caps); the release."""
        return self._detached.acquire(environ)

    def acquire(self, environ: WSGIEnvironment) -> Callable[[], None]:
        """A stream slot; detached runs count against the app's total too."""
        if self._limiter.active + self._detached.active >= self._limiter.max_streams:
            raise HttpError(f"the server is at its limit of {self._limiter.max_streams} concurrent streams "
                            f"(runs going on without their client count too); retry after {self._retry_after} s",
                            429, [("Retry-After", self._retry_after)])
        return self._limiter.acquire(environ)

    # --- starting a run --------------------------------------------------------------------------
    def start(self, engine: EngineLike, messages: List[Message], environ: WSGIEnvironment, options: RunOptions,
              errors: PublicErrors, chat: Optional[ChatRun] = None) -> Response:
        """A new run in the log, driven by this connection's thread; its first reader is this response.

        ``chat``: the run answers a frontend's chat (``useChat``): its response
        is in that protocol, and the chat's index names it as its active run.
        """
        owner = self.owner_of(environ)
        release = self.acquire(environ)
        producer: Optional[RunProducer] = None
        try:
            run_id = new_run_id()
            meta = {"request_id": errors.request_id, **(chat.meta if chat is not None else {})}
            lease = self.log.create(run_id, owner, meta, lease_s=self.lease_s, retain_s=self.retain_s)
            producer = RunProducer(self.log, lease, owner, errors.encode, detach_grace_s=self.detach_grace_s,
                                   window_s=self.append_window_s)
            if chat is not None:
                self._index_chat(owner, chat.chat_id, run_id)
            asks = self.approvals and (chat is None or chat.approvals)
            if asks:
                asking, timeout = producer, self.approval_timeout_s
                options = dict(options, approve=lambda call: asking.ask(call, timeout))  # type: ignore[assignment]
            if self.taker is not None:
                options = self.taker.checkpointed(producer, options, asks)
            start: Callable[..., Any] = engine.run
            run = start(messages, producer.cancel, heartbeat_s=self.append_window_s, **options)
            response = self._attached(producer, run, environ, release, errors, chat)
        except BaseException as exc:
            release()
            if producer is not None:  # the run is in the log: it gets its one terminal, not a lost lease later
                producer.force_end(error_event("not_started", "the engine could not start the run"))
            if isinstance(exc, RunLogError):
                raise HttpError(f"the run log cannot take runs now ({exc}); retry later", 503) from exc
            if isinstance(exc, ConfigError):
                raise engine_refusal(exc) from exc
            raise
        self.stuck.add(response)
        self._log.info("request {}: run {} started for {}", errors.request_id, run_id, environ.get("REMOTE_ADDR", "?"))
        prefix = (environ.get("SCRIPT_NAME") or "").rstrip("/")
        headers = chat.headers if chat is not None else SSE_HEADERS
        return status_line(200), headers + [
            ("X-Run-Id", run_id), ("Location", f"{prefix}{RUNS_PATH}{run_id}/events"),
            ("X-Request-Id", errors.request_id)], response

    def _attached(self, producer: RunProducer, run: Any, environ: WSGIEnvironment, release: Callable[[], None],
                  errors: PublicErrors, chat: Optional[ChatRun]) -> AttachedRun:
        """The response that drives ``run`` into the log and reads it to its first client."""
        batched = getattr(run, "batches", None)
        batches = batched() if callable(batched) else ([event] for event in run)
        set_heartbeat = getattr(run, "set_heartbeat", None)
        if callable(set_heartbeat):  # a StreamingEngine's Run: the short heartbeat only while tokens wait
            producer.wake_with(set_heartbeat)
        render = chat.render(errors.request_id) if chat is not None else SseRender()
        return AttachedRun(self, producer, producer.drive(batches), release, environ, render)

    # --- a chat's active run (useChat's resume) ---------------------------------------------------
    def _index_chat(self, owner: str, chat_id: str, run_id: str) -> None:
        """Name ``run_id`` as the chat's latest run, in the chat's index: a run of the log, found by its id.

        The index's id is a hash of the owner and the chat id, so any worker
        finds it and another owner's chat is another index.  Its lease is
        always out (CHAT_INDEX_LEASE_S): whichever request comes next takes it
        over, atomically, and appends; it is kept ``retain_s`` after that.
        """
        index = chat_index_id(owner, chat_id)
        for _ in range(5):
            try:
                lease: Optional[Lease] = self.log.create(index, owner, {"chat_index": True},
                                                         lease_s=CHAT_INDEX_LEASE_S, retain_s=self.retain_s)
            except RunExistsError:
                lease = self.log.take_over(index)
            if lease is not None:
                try:
                    self.log.append(lease, [("run", json.dumps(run_id))])
                    return
                except RunFencedError:  # another request of the same chat took it over meanwhile
                    pass
            time.sleep(CHAT_INDEX_LEASE_S)
        self._log.warning("run {}: the chat's index stayed busy; a resume of this chat will not find it", run_id)

    def chat_run(self, chat_id: str, owner: str) -> Optional[RunStatus]:
        """The chat's latest run while it runs; None when the chat has none (or it ended)."""
        index = chat_index_id(owner, chat_id)
        try:
            status = self.log.status(index, owner)
            named = [frame for frame in self.log.read(index, owner, max(0, status.last_seq - 1))
                     if isinstance(frame, Frame)]
            if not named:
                return None
            run_id = json.loads(named[-1].data)
            if not isinstance(run_id, str):
                return None
            run = self.log.status(run_id, owner)
        except RunNotFound:
            return None
        except RunLogError as exc:
            raise HttpError(f"the run log cannot be read now ({exc}); retry later", 503) from exc
        return run if run.state == "running" else None

    def resume_chat(self, chat_id: str, environ: WSGIEnvironment, make_render: MakeChatRender,
                    headers: Headers) -> Response:
        """The chat's active run from its start, then live until its end; 204 when the chat has none."""
        owner = self.owner_of(environ)
        status = self.chat_run(chat_id, owner)
        if status is None:
            return status_line(204), [("Cache-Control", "no-store")], []
        _, settled = self._approvals_of(status.run_id, owner)
        release = self.acquire(environ)
        render = make_render(status, (), settled)
        body = Following(self.follow(status.run_id, owner, 0, _probe(environ), render, environ=environ), release,
                         environ, self.stuck)
        return status_line(200), headers + [("X-Run-Id", status.run_id)], body

    def answer_chat(self, chat_id: str, environ: WSGIEnvironment, answers: Sequence[Tuple[str, bool, str]],
                    make_render: MakeChatRender, headers: Headers) -> Response:
        """The user's answers to held calls (``(call_id, approved, reason)``), then the rest of the run.

        Each answer counts only for a call the chat's active run, of this
        owner, is holding (its ``approval_request`` is in the log and its
        result is not); the others are dropped, and a request with none is a
        409.  The log's first answer wins.  The response follows the run from
        the answered request on, on the same message.
        """
        if not self.approvals:
            raise HttpError("approvals over the wire are off on this server (make_wsgi_app(approvals=True)); "
                            "the request's last message answers a tool approval", 409)
        owner = self.owner_of(environ)
        status = self.chat_run(chat_id, owner)
        held = self._approvals_of(status.run_id, owner)[0] if status is not None else {}
        valid = [answer for answer in answers if answer[0] in held]
        if status is None or not valid:
            self._log.warning("chat approvals for calls no run holds were dropped: {}",
                              ", ".join(repr(clip(answer[0], 40)) for answer in answers))
            raise HttpError("no run of this chat (or AG-UI thread) is waiting for an answer about these tool "
                            "calls (answered already, expired, or never asked); send a new message", 409,
                            field="messages")
        try:
            # A reader is here before the answer: a run parked past its detach grace is not taken as abandoned.
            self.log.mark_read(status.run_id, owner)
            for call_id, approved, reason in valid:
                self.log.answer_approval(status.run_id, owner, call_id, approved, reason)
        except RunNotFound as exc:
            raise not_found() from exc
        except RunLogError as exc:
            raise HttpError(f"the run log cannot be reached now ({exc}); retry later", 503) from exc
        release = self.acquire(environ)
        render = make_render(status, [answer[0] for answer in valid], ())
        after = max(held[answer[0]] for answer in valid)
        body = Following(self.follow(status.run_id, owner, after, _probe(environ), render, environ=environ), release,
                         environ, self.stuck)
        return status_line(200), headers + [("X-Run-Id", status.run_id)], body

    def _approvals_of(self, run_id: str, owner: str) -> Tuple[Dict[str, int], List[str]]:
        """The run's held calls (call id -> the seq of its ``approval_request``), and those it asked and settled."""
        held: Dict[str, int] = {}
        settled: List[str] = []
        try:
            for item in read_to_end(self.log, run_id, owner, 0):
                if isinstance(item, Frame) and item.name in ("approval_request", "tool_result"):
                    _note_approval(item, held, settled)
            return held, settled
        except RunNotFound:
            return {}, []
        except RunLogError as exc:
            raise HttpError(f"the run log cannot be read now ({exc}); retry later", 503) from exc

    def detach(self, response: AttachedRun, environ: WSGIEnvironment) -> bool:
        """Hand a run whose client went away to a thread of its own; False when over the detached cap."""
        try:
            release = self._detached.acquire(environ)
        except HttpError:
            return False
        self._log.info("run {}: client gone; the run goes on detached (grace {:g}s)", response.producer.run_id,
                       self.detach_grace_s)
        detach(response.producer, response.driving, release)
        return True

    # --- reading a run ---------------------------------------------------------------------------
    def resume(self, run_id: str, after_seq: int, environ: WSGIEnvironment) -> Response:
        """The frames after ``after_seq``, then live ones until the terminal; 204 when the client has it."""
        owner = self.owner_of(environ)
        try:
            status = self.log.status(run_id, owner)
        except RunNotFound as exc:
            raise not_found() from exc
        except RunLogError as exc:
            raise HttpError(f"the run log cannot be read now ({exc}); retry later", 503) from exc
        if status.state != "running" and after_seq >= status.last_seq:
            return status_line(204), [("Cache-Control", "no-cache")], []
        release = self.acquire(environ)
        body = Following(self.follow(run_id, owner, after_seq, _probe(environ), environ=environ), release, environ,
                         self.stuck)
        return status_line(200), SSE_HEADERS + [("X-Run-Id", run_id)], body

    def follow(self, run_id: str, owner: str, after_seq: int, disconnected: Optional[Callable[[], bool]],
               render: Optional[Render] = None, head: Optional[bytes] = None,
               environ: Optional[WSGIEnvironment] = None) -> Generator[bytes, None, None]:
        """``head`` (``retry:``), every frame after ``after_seq`` as it is appended, ``[DONE]`` after the terminal.

        ``head`` goes out with the frames the log already has, in one write: a
        reconnect costs one socket write, not two.  ``render`` writes them
        (default: the app's own events, an ``id:`` on each).
        """
        render = render if render is not None else SseRender()
        head = render.head() if head is None else head
        last_write = time.monotonic()
        next_mark = 0.0
        while True:
            now = time.monotonic()
            wait = 0.0 if head else _read_wait(self.heartbeat_s, disconnected)
            try:
                if now >= next_mark:
                    self.log.mark_read(run_id, owner)
                    next_mark = now + MARK_READ_S
                items = self.log.read(run_id, owner, after_seq, timeout_s=wait)
                if not items and not head and self._look(run_id, owner, after_seq, environ):
                    yield render.done()
                    return
            except RunNotFound:
                yield head + render.error("run_expired", "the run is gone (its retention ran out); start a new run") \
                    + render.done()
                return
            except RunLogError as exc:
                self._log.warning("run {}: reading the log failed: {}", run_id, exc)
                yield head + render.error("log_unavailable", "the run log cannot be read now; reconnect later") \
                    + render.done()
                return
            parts: List[bytes] = [head] if head else []
            head = b""
            for item in items:
                if isinstance(item, Gap):
                    parts.append(render.gap(item))
                    after_seq = item.next_seq - 1
                    continue
                parts.append(render.frames(run_id, [item]))
                after_seq = item.seq
                if item.terminal or render.parked():
                    parts.append(render.done())
                    yield b"".join(parts)
                    return
            now = time.monotonic()
            if parts:
                yield b"".join(parts)
                last_write = now
            elif disconnected is not None and disconnected():
                return
            elif self.heartbeat_s is not None and now - last_write >= self.heartbeat_s:
                yield PING_FRAME
                last_write = now

    def _look(self, run_id: str, owner: str, after_seq: int, environ: Optional[WSGIEnvironment]) -> bool:
        """Nothing new: close the run as producer_lost if its lease ran out; whether it ended under the reader."""
        status = self.log.status(run_id, owner)
        if self._closed_as_lost(status, owner, environ):
            return False
        return status.state != "running" and after_seq >= status.last_seq

    def _closed_as_lost(self, status: RunStatus, owner: str, environ: Optional[WSGIEnvironment]) -> bool:
        """Take over (``self.taker``) or close as ``producer_lost`` a running run whose lease ran out: whoever looks
        at it notices (a reader, a status poll).  A chat's index is left alone: its lease is out by design."""
        if status.state != "running" or not status.lease_expired or status.meta.get("chat_index"):
            return False
        if self.taker is not None and environ is not None and self.taker.take_over(status, owner, environ):
            return True
        if self.log.close_lost(status.run_id):
            self._log.warning("run {}: its producer stopped renewing its lease; closed as producer_lost",
                              status.run_id)
        return True

    # --- the other routes -----------------------------------------------------------------------
    def route(self, path: str, method: str, environ: WSGIEnvironment,
              read_json: Callable[[WSGIEnvironment], Any]) -> Response:
        """``/v1/runs/...``: events, status, stop, approvals (the app checked Host, site and authorization)."""
        found = _RUN_PATH.match(path)
        if found is None:
            raise not_found()
        run_id, what, call_id = found.group(1), found.group(2) or "", found.group(3)
        wanted = "GET" if what in ("", "/events") else "POST"
        if method != wanted:
            raise HttpError(f"method {method} is not allowed on {path}; use {wanted}", 405, [("Allow", wanted)])
        if what == "/events":
            resumed = last_event_id(environ)
            if resumed is not None and resumed[0] != run_id:
                raise HttpError("Last-Event-ID names another run than the path; reconnect to the run it names",
                                field="Last-Event-ID")
            return self.resume(run_id, resumed[1] if resumed else 0, environ)
        owner = self.owner_of(environ)
        try:
            if what == "":
                status = self.log.status(run_id, owner)
                if self._closed_as_lost(status, owner, environ):
                    status = self.log.status(run_id, owner)
                return json_response(200, status_payload(status))
            if what == "/stop":
                self.log.request_stop(run_id, owner)
                return json_response(202, {"run_id": run_id, "stop_requested": True})
            return self._answer(run_id, owner, call_id or "", read_json(environ))
        except RunNotFound as exc:
            raise not_found() from exc
        except RunLogError as exc:
            raise HttpError(f"the run log cannot be reached now ({exc}); retry later", 503) from exc

    def _answer(self, run_id: str, owner: str, call_id: str, payload: Any) -> Response:
        if not self.approvals:
            raise HttpError("approvals over the wire are off on this server (make_wsgi_app(approvals=True))", 404)
        approved = payload.get("approved") if isinstance(payload, dict) else None
        reason = payload.get("reason", "") if isinstance(payload, dict) else ""
        if not isinstance(approved, bool):
            raise HttpError('send {"approved": true} or {"approved": false, "reason": "..."}', field="approved")
        if not isinstance(reason, str):
            raise HttpError("reason must be a string", field="reason")
        try:
            answer = self.log.answer_approval(run_id, owner, call_id, approved, reason)
        except ConfigError as exc:
            raise HttpError(f"bad call id: {exc}", field="call_id") from exc
        return json_response(200, {"call_id": answer.call_id, "approved": answer.approved, "reason": answer.reason})


class AttachedRun:
    """The response of the request that started a run: drives it, sends what the log took, detaches on a drop."""

    def __init__(self, routes: RunRoutes, producer: RunProducer, driving: Generator[List[Frame], None, None],
                 release: Callable[[], None], environ: WSGIEnvironment, render: Render) -> None:
        self.producer = producer
        self._render = render
        self.driving = driving
        self._routes = routes
        self._release = release
        self._environ = environ  # whose run it is, for the detached runs' per-client cap
        self._disconnected = _probe(environ)
        self._drop = connection_dropper(environ)
        self._finished = False
        self._closed = False
        self.parked = False  # the response ended at a held call; the run goes on detached
        self.writing_since: Optional[float] = None
        self.cancel = threading.Event()  # set once given up on (StuckReaders)

    def __iter__(self) -> Iterator[bytes]:
        return _tracked(self._writes(), self)

    def give_up(self) -> None:
        """The client took nothing for too long: drop its connection; close() then detaches or cancels the run."""
        self.cancel.set()
        if self._routes.on_disconnect == "cancel":
            self.producer.cancel_run("stuck_reader")
        drop, self._drop = self._drop, None
        if drop is not None and not self._closed:
            drop()

    def _writes(self) -> Generator[bytes, None, None]:
        run_id = self.producer.run_id
        routes = self._routes
        render = self._render
        yield render.head()
        last_write = next_probe = time.monotonic()
        after = 0
        for frames in self.driving:
            now = time.monotonic()
            if frames:
                after = frames[-1].seq
                data = render.frames(run_id, frames)
                if frames[-1].terminal:
                    self._finished = True
                    self.driving.close()  # the producer's end (unregistered, its run's threads gone) before the write
                    yield data + render.done()
                    return
                if render.parked():  # a held call: the response ends, the run waits on (close() detaches it)
                    self.parked = True
                    yield data + render.done()
                    return
                yield data
                last_write = now
            elif now >= next_probe:
                next_probe = now + PROBE_S
                if self._disconnected is not None and self._disconnected():
                    return  # close() detaches or cancels
                if routes.heartbeat_s is not None and now - last_write >= routes.heartbeat_s:
                    yield PING_FRAME
                    last_write = now
        self._finished = True
        self.driving.close()
        if self.producer.log_failed is not None:
            yield render.error("log_unavailable", "the run log failed; the run was cancelled") + render.done()
            return
        # Fenced: another wrote the terminal (producer_lost, worker_shutdown): the client gets it from the log.
        yield from routes.follow(run_id, self.producer.owner, after, self._disconnected, render, head=b"",
                                 environ=self._environ)

    def close(self) -> None:
        """After the last frame: free the slot.  Before it (client gone): detach or cancel, per the app."""
        if self._closed:
            return
        self._closed = True
        self._drop = None
        self._routes.stuck.remove(self)
        try:
            going = not self._finished and not self.producer.wait_ended(0)
            detaching = self.parked or self._routes.on_disconnect == "detach"
            if going and not (detaching and self._routes.detach(self, self._environ)):
                self.producer.cancel_run("disconnected")
                for _ in self.driving:  # the run ends itself here: tools cancelled, its done in the log
                    pass
        finally:
            self._release()


class Following:
    """The response of a reader following a run: its slot freed on close, its connection dropped if it reads nothing."""

    def __init__(self, body: Generator[bytes, None, None], release: Callable[[], None], environ: WSGIEnvironment,
                 stuck: StuckReaders) -> None:
        self._body = body
        self._release = release
        self._drop = connection_dropper(environ)
        self._stuck = stuck
        self.writing_since: Optional[float] = None
        self.cancel = threading.Event()
        stuck.add(self)

    def __iter__(self) -> Iterator[bytes]:
        return _tracked(self._body, self)

    def give_up(self) -> None:
        self.cancel.set()
        drop, self._drop = self._drop, None
        if drop is not None:
            drop()

    def close(self) -> None:
        self._drop = None
        self._stuck.remove(self)
        try:
            self._body.close()
        finally:
            self._release()


class _Writing(Protocol):
    writing_since: Optional[float]


def _tracked(body: Iterator[bytes], response: _Writing) -> Generator[bytes, None, None]:
    """``body``'s writes, with ``response.writing_since`` set while one is in the server's hands."""
    monotonic = time.monotonic
    for chunk in body:
        response.writing_since = monotonic()
        yield chunk
        response.writing_since = None


def _probe(environ: WSGIEnvironment) -> Optional[Callable[[], bool]]:
    probe = environ.get("waitress.client_disconnected")
    return probe if callable(probe) else None


def _read_wait(heartbeat_s: Optional[float], disconnected: Optional[Callable[[], bool]]) -> float:
    wait = READ_WAIT_S if heartbeat_s is None else min(READ_WAIT_S, heartbeat_s)
    return min(wait, PROBE_S) if disconnected is not None else wait


def _error_frame(code: str, message: str) -> bytes:
    """A reader's own fatal ``error`` (no ``id:``: it is not in the log)."""
    name, data = error_event(code, message)
    return f"event: {name}\ndata: {data}\n\n".encode()
