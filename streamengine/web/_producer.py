"""One engine run driven into a run log: coalesced appends, the lease, stop, detach, exactly one terminal.

Why it is built this way:

* **The log first.**  Every frame a client gets was appended before it is
  sent (the attached response sends what :meth:`RunProducer.drive` hands it,
  which is what the log accepted), so a reader on another worker never
  sees less than the client that started the run.
* **Coalesced appends.**  Appending each token costs more than the engine's
  whole per-token work, so tokens within ``window_s`` of the last tokens
  appended wait to go with the next events; the first token after a pause,
  and every other event (a tool's start or result, an error), go out at
  once, and the engine's heartbeat (every ``window_s`` of silence) flushes
  what waits.
* **Fenced.**  A ``RunFencedError`` (the run was closed as lost, or stopped
  by a shutdown) means someone else wrote its terminal: the producer writes
  nothing more and cancels the run and its tools.
* **One thread a stream.**  While the client is attached the connection's
  thread drives the run; on a disconnect :func:`detach` hands the same
  generator to a thread of its own, which cancels the run as ``abandoned``
  once no reader came back (``RunStatus.read_ago_s``) within the grace.
"""
from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Tuple, Union

from .._cancel import CancelToken
from .._engine.events import DoneEvent, Event, HeartbeatEvent
from .._engine.result import CUT_OFF_FINISH_REASONS
from .._logs import component_logger
from .._messages import ToolCall
from ..runs import Frame, Gap, Lease, RunFencedError, RunLog, RunLogError
from ..runs import _local as local
from ._sse import PublicErrors

#: How long tokens wait to be joined with the next events (the first after a pause, and any other event, never
#: waits): make_wsgi_app's default ``append_window_s``.  Bench section 16: at a chat's 30 tokens/s, 0.1 s joins
#: about three tokens per append and brings Redis from ~1.5-1.8x to ~1.1x the CPU per token of no log.
APPEND_WINDOW_S = 0.1
#: How often the producer looks at the stop flag, and a detached one at its readers; how long a quiet run
#: (nothing waiting to be appended) sleeps between looks.
STOP_POLL_S = 0.25
ABANDON_POLL_S = 1.0

Encode = Callable[[Event], bytes]
LogEvent = Tuple[str, str]

_log = component_logger("streamengine.web.runs")


def log_event(frame: bytes) -> Optional[LogEvent]:
    """An SSE frame as the web layer renders it, as a log event ``(name, json_text)``; None for a comment.

    The log keeps what the browser would have got (errors already made
    public), so a reader on any worker sends the same bytes.
    """
    text = frame.decode("ascii")
    if text.startswith("data: "):
        return "token", text[6:-2]
    if text.startswith("event: "):
        name, _, data = text[7:].partition("\ndata: ")
        return name, data[:-2]
    return None


def frame_object(frame: Frame) -> Optional[Dict[str, Any]]:
    """A log frame's data as a JSON object; None for one that is not (a token's string, unreadable text)."""
    try:
        data = json.loads(frame.data)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def frame_call(frame: Frame, data: Dict[str, Any]) -> Dict[str, Any]:
    """The call a ``tool_start``, ``tool_approved`` or ``approval_request`` frame names, with a str ``id``;
    {} for none."""
    call = data.get("call") if frame.name in ("tool_approved", "approval_request") else data
    return call if isinstance(call, dict) and isinstance(call.get("id"), str) else {}


def read_to_end(log: RunLog, run_id: str, owner: str, after_seq: int) -> Iterator[Union[Gap, Frame]]:
    """Every frame (and gap) the log holds for the run after ``after_seq``, read page by page without waiting."""
    while True:
        items = log.read(run_id, owner, after_seq)
        if not items:
            return
        for item in items:
            after_seq = item.next_seq - 1 if isinstance(item, Gap) else item.seq
            yield item


def logged_event(name: str, data: str) -> Optional[SimpleNamespace]:
    """A log frame back as an object with its engine event's attributes, for another protocol's encoder.

    The log keeps one format (the app's own events, :func:`log_event`); the
    frontends' protocols encode a run's frames on read, with :class:`LoggedErrors`
    since the texts in the log are already public.  None for a frame that is
    not a JSON object (or a token's string).
    """
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if name == "token":
        return SimpleNamespace(name=name, text=value) if isinstance(value, str) else None
    if not isinstance(value, dict):
        return None
    if name == "tool_start":
        call = ToolCall(str(value.get("id")), str(value.get("name")), str(value.get("arguments") or ""))
        return SimpleNamespace(name=name, call=call)
    if name == "tool_result":
        result = SimpleNamespace(timed_out=False, **{key: value.get(key) for key in (
            "call_id", "name", "ok", "text", "error", "duration_s")})
        return SimpleNamespace(name=name, result=result, skipped=value.get("skipped"), call=None)
    if name == "done":
        telemetry = value.get("telemetry")
        reasons = telemetry.get("finish_reasons") if isinstance(telemetry, dict) else None
        last = reasons[-1] if isinstance(reasons, list) and reasons else None
        return SimpleNamespace(name=name, result=SimpleNamespace(
            answer=value.get("answer"), refusal=value.get("refusal"), usage=value.get("usage"), telemetry=telemetry,
            cut_off=last if last in CUT_OFF_FINISH_REASONS else None))
    return SimpleNamespace(**{**value, "name": name})


class LogRender:
    """A run's log frames, encoded on read by a frontend protocol's framer (``stream``).

    The log keeps one format for every protocol; the response that started a
    run and every resume on any worker read its frames through one of these.
    A subclass says how the protocol ends (:meth:`done`, :meth:`error`) and
    which logged events a replay passes by.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def parked(self) -> bool:
        """The stream ended at a held call (its answer comes in the client's next request)."""
        return bool(self._stream.parked)

    def head(self) -> bytes:
        return bytes(self._stream.opening())

    def frames(self, run_id: str, frames: List[Frame]) -> bytes:
        out: List[bytes] = []
        for frame in frames:
            event = logged_event(frame.name, frame.data)
            if event is not None and not self._passed_by(event):
                out.append(self._stream.encode(event))
        return b"".join(out)

    def _passed_by(self, event: object) -> bool:
        return False

    def gap(self, gap: Gap) -> bytes:
        """The log no longer keeps the run's start: the stream goes on from what it keeps."""
        return b""

    def error(self, code: str, message: str) -> bytes:
        raise NotImplementedError

    def done(self) -> bytes:
        raise NotImplementedError


class LoggedErrors(PublicErrors):
    """The texts of a run's log as they are: they were made public before they were appended."""

    def public(self, what: str, detail: object) -> str:
        return str(detail)

    def token_text(self, text: str) -> str:
        return text

    def telemetry(self, telemetry: object) -> object:
        return telemetry


def checkpoint_record(context: Dict[str, Any], checkpoint: Any) -> str:
    """What the log keeps as a run's checkpoint: the engine's, and the run's options a taker needs (web._takeover)."""
    return json.dumps({**context, "checkpoint": checkpoint.to_json()}, ensure_ascii=True, separators=(",", ":"))


def error_event(code: str, message: str) -> LogEvent:
    return "error", json.dumps({"message": message, "fatal": True, "code": code})


class RunProducer:
    """Drives one engine run into ``log`` under ``lease``; :meth:`drive` is the generator a thread iterates."""

    def __init__(self, log: RunLog, lease: Lease, owner: str, encode: Encode, *, detach_grace_s: float,
                 window_s: float = APPEND_WINDOW_S, last_seq: int = 0) -> None:
        self.log = log
        self.lease = lease
        self.owner = owner
        self.cancel = CancelToken()
        self.cancel_reason: Optional[str] = None
        self.fenced = False
        self.log_failed: Optional[RunLogError] = None
        self.detached_at: Optional[float] = None
        self._encode = encode
        self._grace_s = detach_grace_s
        self._window_s = window_s
        self._lock = threading.Lock()  # the pending events and appends: the approve thread appends too
        self._pending: List[LogEvent] = []
        self._other_waits = False  # an event that is not a token waits: only tokens wait for the window
        self._out: List[Frame] = []
        self._last_write = self._last_tokens = -1e9
        self._next_stop_poll = self._next_abandon_poll = 0.0
        self._ended = threading.Event()
        self._terminal = False
        self._beat: Optional[Callable[[Optional[float]], None]] = None
        self._holding = True  # the run starts with the window's heartbeat (an engine of your own keeps it)
        self._asking = 0  # held calls waiting for an answer (ask() runs on the engine's approval threads)
        self._last_seq = last_seq  # the seq of the last frame this producer's run has in the log
        #: What a worker taking the run over needs besides the engine's checkpoint (web._takeover); None: no saves.
        self.checkpoint_context: Optional[Dict[str, Any]] = None

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    # --- driving ----------------------------------------------------------------------------
    def wake_with(self, set_heartbeat: Callable[[Optional[float]], None]) -> None:
        """The run's ``set_heartbeat``: woken every ``window_s`` only while tokens wait, every STOP_POLL_S else.

        A run waking every ``window_s`` while nothing waits costs loop turns
        for nothing at a chat's pace (bench section 16); so the short
        heartbeat is on only while tokens are held back.
        """
        self._beat = set_heartbeat
        self._hold(False)

    @property
    def _stop_poll_s(self) -> float:
        return min(STOP_POLL_S, self.lease.lease_s / 4)

    def _hold(self, holding: bool) -> None:
        if holding != self._holding and self._beat is not None:
            self._beat(self._window_s if holding else self._stop_poll_s)
            self._holding = holding

    def drive(self, batches: Iterator[List[Event]]) -> Generator[List[Frame], None, None]:
        """The run's batches into the log; yields the frames appended since the last yield (often none).

        The last frame yielded is the terminal one, unless the producer was
        fenced or the log failed (then :attr:`fenced` / :attr:`log_failed` say so).
        """
        local.register(self)
        try:
            done: Optional[DoneEvent] = None
            for batch in batches:
                events: List[LogEvent] = []
                for event in batch:
                    if event.__class__ is DoneEvent:
                        done = event
                    elif event.__class__ is not HeartbeatEvent:
                        encoded = log_event(self._encode(event))
                        if encoded is not None:
                            events.append(encoded)
                if events:
                    self._queue(events)
                if not self._step(done is not None):
                    break
                yield self._take()
            else:
                self._finish(done)
                yield self._take()
        except Exception as exc:  # the engine (or a hook) failed: the run's terminal says so
            _log.opt(exception=exc).error("run {}: failed while producing: {}", self.run_id, exc)
            self._finish_with(error_event("internal_error", "the run failed on the server; see its log"), "failed")
            yield self._take()
        finally:
            try:
                self._end(batches)
            finally:  # whatever ending the run raised, the producer is not left registered (shutdown waits on it)
                self._ended.set()
                local.unregister(self)

    def _end(self, batches: Iterator[List[Event]]) -> None:
        """The run's engine closed (a run left early is cancelled here), and its one terminal written."""
        if self.fenced or self.log_failed is not None:
            self.cancel.set()
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a run left early is cancelled and ended here (its tools, its socket)
        if not (self._terminal or self.fenced or self.log_failed is not None):  # closed early: still one terminal
            self.cancel_run("closed")
            self._finish_with(("done", json.dumps({"answer": None, "cancel_reason": self.cancel_reason})),
                              "cancelled")

    def _step(self, last: bool) -> bool:
        """Append, renew, poll the stop flag and the readers as due; False once the producer must stop writing."""
        now = time.monotonic()
        try:
            with self._lock:
                if self._pending and (last or now - self._last_tokens >= self._window_s or self._other_waits):
                    self._append_pending(now)
                self._hold(bool(self._pending))
            if now - self._last_write >= self.lease.lease_s / 3:
                self.log.renew(self.lease)
                self._last_write = now
            if now >= self._next_stop_poll:
                self._next_stop_poll = now + self._stop_poll_s
                if self.log.stop_requested(self.lease):
                    self.cancel_run("stopped")
            if self.detached_at is not None and now >= self._next_abandon_poll:
                self._next_abandon_poll = now + ABANDON_POLL_S
                self._check_abandoned(now)
        except RunFencedError:
            self.fenced = True
        except RunLogError as exc:
            self._log_failed(exc)
        return not (self.fenced or self.log_failed is not None)

    def _queue(self, events: List[LogEvent]) -> None:
        """``events`` wait for the next append (under the lock: the approval thread appends too)."""
        with self._lock:
            self._pending += events
            self._other_waits = self._other_waits or any(name != "token" for name, _ in events)

    def _append_pending(self, now: float) -> None:
        """Under the lock: the pending events become frames (fenced or failing: raised, nothing sent)."""
        events, self._pending, self._other_waits = self._pending, [], False
        last, stop = self.log.append_and_poll(self.lease, events)
        self._last_seq = last
        first = last - len(events) + 1
        self._out.extend(Frame(first + index, name, data) for index, (name, data) in enumerate(events))
        self._last_write = now
        self._next_stop_poll = now + self._stop_poll_s  # the append read the stop flag: no poll of its own
        if stop:
            self.cancel_run("stopped")
        if events[-1][0] == "token":
            self._last_tokens = now

    def _take(self) -> List[Frame]:
        with self._lock:
            out, self._out = self._out, []
        return out

    def _check_abandoned(self, now: float) -> None:
        assert self.detached_at is not None
        if self._asking or now - self.detached_at < self._grace_s:
            return  # a held call waits for its answer (bounded by the approval's own timeout), not for a reader
        read_ago = self.log.status(self.run_id, self.owner).read_ago_s
        if read_ago is None or read_ago >= self._grace_s:
            _log.info("run {}: nobody came back for it within {:g}s; cancelling it (abandoned)", self.run_id,
                      self._grace_s)
            self.cancel_run("abandoned")

    def cancel_run(self, reason: str) -> None:
        """Cancel the run (provider and tools); its ``done`` will say why.  The first reason stays."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancel.set()

    # --- the terminal -----------------------------------------------------------------------
    def _finish(self, done: Optional[DoneEvent]) -> None:
        if self.cancel_reason == local.WORKER_SHUTDOWN:  # only shut_down gives that reason
            self._finish_with(local.shutdown_event(), "failed")
            return
        if done is None:
            self._finish_with(error_event("internal_error", "the run ended without its done event"), "failed")
            return
        name, data = log_event(self._encode(done)) or ("done", "{}")
        payload: Dict[str, Any] = json.loads(data)
        stop_reason = getattr(getattr(done.result, "telemetry", None), "stop_reason", None)
        state = "done"
        if str(stop_reason) == "cancelled" or self.cancel.is_set():
            state = "cancelled"
            payload["cancel_reason"] = self.cancel_reason or "cancelled"
        self._finish_with((name, json.dumps(payload, ensure_ascii=True, separators=(",", ":"))), state)

    def _finish_with(self, terminal: LogEvent, state: str) -> None:
        now = time.monotonic()
        try:
            with self._lock:
                if self._pending:
                    self._append_pending(now)
                seq = self.log.finish(self.lease, terminal, state=state)
                self._terminal = True
                self._out.append(Frame(seq, terminal[0], terminal[1], True))
        except RunFencedError:
            self.fenced = True
        except RunLogError as exc:
            self._log_failed(exc)

    def save_checkpoint(self, checkpoint: Any) -> None:
        """The engine's ``on_checkpoint``: the frames before it appended, then it saved after the last one.

        Runs on the driving thread, at a round boundary (the round's events
        were handed over already).  A fenced producer stops writing; a log that
        failed to save it is only logged: the run goes on, and if its worker
        died before the next save, the run is taken over from the one before.
        """
        if self.checkpoint_context is None:
            return
        record = checkpoint_record(self.checkpoint_context, checkpoint)
        try:
            with self._lock:
                if self._pending:
                    self._append_pending(time.monotonic())
                self.log.save_checkpoint(self.lease, self._last_seq, record)
        except RunFencedError:
            self.fenced = True
        except RunLogError as exc:
            _log.opt(exception=exc).warning("run {}: its checkpoint after round {} was not saved: {}", self.run_id,
                                            checkpoint.round, exc)

    def _log_failed(self, exc: RunLogError) -> None:
        _log.opt(exception=exc).error("run {}: the run log failed, so the run is cancelled: {}", self.run_id, exc)
        self.log_failed = exc
        self.cancel_run("log_unavailable")

    # --- approvals over the wire ------------------------------------------------------------
    def ask(self, call: ToolCall, expires_in_s: float) -> bool:
        """Ask the run's readers about a held call (``approval_request``); their first answer, False at expiry.

        Runs on the engine's approval thread: the request is appended after
        every pending event, and the answer read from the log, so any
        worker's ``POST .../approvals/<call_id>`` reaches it.
        """
        request = ("approval_request", json.dumps({
            "call": {"id": call.id, "name": call.name, "arguments": call.arguments},
            "expires_in_s": expires_in_s}, ensure_ascii=True, separators=(",", ":")))
        deadline = time.monotonic() + expires_in_s
        with self._lock:
            self._asking += 1
        try:
            with self._lock:
                self._pending.append(request)
                self._append_pending(time.monotonic())
            while not self.cancel.is_set():
                answer = self.log.approval_answer(self.lease, call.id)
                if answer is not None:
                    return answer.approved
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cancel.wait(min(0.1, remaining))
        except RunFencedError:  # someone else ended the run: the call is refused, the driver stops writing
            self.fenced = True
        except RunLogError as exc:  # the log failed: the run is cancelled with its cause, the call refused
            self._log_failed(exc)
        finally:
            with self._lock:
                self._asking -= 1
        return False

    def note_approved(self, call: ToolCall) -> bool:
        """Log ``tool_approved`` for a side-effect call before it runs; False (refuse it) when the log did not
        take it.

        A tool's ``tool_start`` reaches the log only with the producer's next
        append: a worker killed in between would leave a call that ran with no
        trace, and a taker (web._takeover) would run it again.
        """
        approved = ("tool_approved", json.dumps({"call": {"id": call.id, "name": call.name,
                                                          "arguments": call.arguments}},
                                                ensure_ascii=True, separators=(",", ":")))
        try:
            with self._lock:
                self._pending.append(approved)
                self._append_pending(time.monotonic())
            return True
        except RunFencedError:  # someone else ended the run: the call is refused, the driver stops writing
            self.fenced = True
        except RunLogError as exc:  # the log failed: the run is cancelled with its cause, the call refused
            self._log_failed(exc)
        return False

    # --- shutdown (runs._local) ---------------------------------------------------------------
    def shut_down(self) -> None:
        self.cancel_run(local.WORKER_SHUTDOWN)

    def wait_ended(self, timeout_s: float) -> bool:
        return self._ended.wait(timeout_s)

    def force_end(self, terminal: Optional[LogEvent] = None) -> None:
        """Write the terminal (``worker_shutdown`` unless another is given) from this thread; fenced: nothing."""
        try:
            self.log.finish(self.lease, terminal or local.shutdown_event(), state="failed")
        except RunLogError as exc:  # fenced: it ended meanwhile; failing: its readers see producer_lost
            _log.info("run {}: no worker_shutdown terminal written ({})", self.run_id, exc)


def detach(producer: RunProducer, driving: Generator[List[Frame], None, None],
           on_end: Callable[[], None]) -> threading.Thread:
    """Go on driving ``driving`` on a thread of its own (the client went away); ``on_end`` when it ends."""
    producer.detached_at = time.monotonic()

    def run() -> None:
        try:
            for _ in driving:
                pass
        except Exception as exc:  # pragma: no cover - drive() ends every run itself
            _log.opt(exception=exc).error("run {}: detached producer failed: {}", producer.run_id, exc)
        finally:
            on_end()

    thread = threading.Thread(target=run, name=f"streamengine-run-{producer.run_id[:8]}", daemon=True)
    thread.start()
    return thread
