"""A run whose worker died, taken over by the worker that noticed, from its last checkpoint (``take_over=True``).

The producer saves a checkpoint in the run log before the run's first round
(the request: its messages and options) and after each round whose tool
results are all in (:meth:`RunProducer.save_checkpoint`).  Where a reader
or a status poll finds the run's lease expired, :meth:`Taker.take_over`
takes the lease (atomically: one worker wins, the old producer is fenced)
and drives the run on here, detached, from that checkpoint: the engine
announces it with ``reset`` for the interrupted round and asks that round
again.  No checkpoint, one that does not parse, or no detached slot: the
run is closed as ``producer_lost``, as without takeover.

Why it is built this way:

* **The log says what the interrupted round started.**  Its frames after
  the checkpoint's seq hold each ``tool_start`` and ``approval_request`` and
  the ``tool_result`` logged for them (a call only asked about, with no
  answer in the log, never ran: it is asked again); the resumed round answers an equal
  side-effect call with that result, or with an error saying it may have
  taken effect (``Checkpoint.interrupted``).  A gap there (frames trimmed)
  means the log cannot say: the run is closed as ``producer_lost``.  A call
  left without a result gets one first (``skipped: interrupted``), so no
  frontend shows its card running for ever; then the engine's ``reset``.
* **Same app, same options.**  The checkpoint holds the run's RAG scope and
  whether it asked its readers about side-effect calls; the app's own
  ``approve(call, environ)`` is asked with the environ of the request that
  took the run over (the run's owner's).
"""
from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .._engine.checkpoint import Checkpoint, InterruptedCall
from .._engine.events import ToolResultEvent
from .._engine.tool_calls import INTERRUPTED
from .._errors import ConfigError
from .._messages import ToolCall, ToolResult
from ..runs import Frame, Gap, Lease, RunLogError, RunStatus, SavedCheckpoint
from ._guard import HttpError
from ._producer import RunProducer, detach, error_event, frame_call, frame_object, log_event, read_to_end
from ._sse import EngineLike, PublicErrors, RunOptions

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from ._runs import RunRoutes

#: Frames that start a call (``tool_approved``: logged before an approved side-effect call runs).
_STARTS = ("tool_start", "tool_approved", "approval_request")
#: A round whose every taker died in turn is not taken over again (a tool that kills its worker would take
#: down every worker in turn): its run is closed as producer_lost.
MAX_TAKEOVERS = 2
#: What the engine's ``reset`` of a resumed run says (counted to bound takeovers).
TAKEN_OVER = "taken over"
#: The terminal of a run that had a checkpoint but could not be taken over.
_NOT_TAKEN = "the worker producing this run stopped, and the run could not be taken over from its checkpoint"


def takes_checkpoints(engine: EngineLike) -> bool:
    """Whether ``engine.run`` takes ``on_checkpoint=`` (a StreamingEngine's does): only then can runs be taken over."""
    try:
        parameters = inspect.signature(engine.run).parameters
    except (TypeError, ValueError):
        return False
    return "on_checkpoint" in parameters


class Taker:
    """Checkpoints for the app's runs, and their takeover when their worker died (see the module doc)."""

    def __init__(self, routes: RunRoutes, engine: EngineLike, options_for: Callable[[WSGIEnvironment], RunOptions],
                 make_errors: Callable[[str], PublicErrors]) -> None:
        self._routes = routes
        self._engine = engine
        self._options_for = options_for
        self._make_errors = make_errors

    def checkpointed(self, producer: RunProducer, options: RunOptions, asks: bool) -> RunOptions:
        """``options`` with the producer's checkpoints on, and every approval logged before its call runs; what a
        taker needs besides them goes in each checkpoint."""
        producer.checkpoint_context = {"conversation_id": options.get("conversation_id"), "asks": asks}
        return dict(options, on_checkpoint=producer.save_checkpoint,  # type: ignore[return-value]
                    **self._logged_approve(producer, options.get("approve")))

    def _logged_approve(self, producer: RunProducer, approve: Optional[Callable[[ToolCall], object]]
                        ) -> Dict[str, Callable[[ToolCall], bool]]:
        """``{"approve": ...}``: the run's approve (or the engine's), with a yes logged before the call runs."""
        approve = approve if approve is not None else getattr(self._engine, "approve", None)
        if approve is None:  # every side-effect call is refused: nothing can run unlogged
            return {}
        asked = approve

        def approve_and_log(call: ToolCall) -> bool:
            return bool(asked(call)) and producer.note_approved(call)
        return {"approve": approve_and_log}

    def take_over(self, status: RunStatus, owner: str, environ: WSGIEnvironment) -> bool:
        """Take over the run whose lease ran out and drive it on here; False when it is to be closed as lost."""
        routes, run_id = self._routes, status.run_id
        saved = routes.log.checkpoint(run_id)
        if saved is None:
            return False
        try:
            record, checkpoint = _parsed(saved)
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            routes.logger.opt(exception=exc).warning("run {}: its checkpoint does not parse ({}); closing it as "
                                                     "producer_lost", run_id, exc)
            return False
        try:
            release = routes.detached_slot(environ)
        except HttpError:
            routes.logger.warning("run {}: no detached slot free to take it over; closing it as producer_lost", run_id)
            return False
        try:
            lease = routes.log.take_over(run_id)
        except BaseException:  # the store failed (or the run is gone): the slot is not kept
            release()
            raise
        if lease is None:  # another worker took it, or it ended: not lost
            release()
            return True
        errors = self._make_errors(str(status.meta.get("request_id") or ""))
        try:
            newer = routes.log.checkpoint(run_id)  # a frozen producer revived before the lease moved may have saved
            if newer is not None and newer != saved:  # another since the first look: go on
                saved, (record, checkpoint) = newer, _parsed(newer)  # from that one
            calls, open_calls, last_seq = interrupted_calls(routes, run_id, owner, saved.after_seq, lease)
            last_seq = close_open_calls(routes, lease, errors, open_calls) or last_seq
            producer = RunProducer(routes.log, lease, owner, errors.encode, detach_grace_s=routes.detach_grace_s,
                                   window_s=routes.append_window_s, last_seq=last_seq)
            driving = self._resume(producer, checkpoint.after_interruption(calls), record, environ)
            detach(producer, driving, release)
        except Exception as exc:
            release()
            routes.logger.opt(exception=exc).error("run {}: taking it over failed, so it is closed as producer_lost: "
                                                   "{}", run_id, exc)
            try:
                routes.log.finish(lease, error_event("producer_lost", _NOT_TAKEN), state="failed")
            except RunLogError as failed:  # fenced or failing: its readers close it as lost after this lease
                routes.logger.info("run {}: no producer_lost terminal written ({})", run_id, failed)
            return True
        routes.logger.warning("run {}: its worker stopped; taken over here from its checkpoint after round {}",
                              run_id, checkpoint.round)
        return True

    def _resume(self, producer: RunProducer, checkpoint: Checkpoint, record: Dict[str, Any],
                environ: WSGIEnvironment) -> Any:
        """The run from ``checkpoint`` on, driven into the log by ``producer`` (not started: a generator)."""
        options: Dict[str, Any] = dict(self._options_for(environ))
        options.pop("conversation_id", None)
        if record.get("conversation_id") is not None:
            options["conversation_id"] = record["conversation_id"]
        if record.get("asks") and self._routes.approvals:
            timeout = self._routes.approval_timeout_s
            options["approve"] = lambda call: producer.ask(call, timeout)
        options.update(self._logged_approve(producer, options.get("approve")))
        producer.checkpoint_context = {"conversation_id": record.get("conversation_id"), "asks": record.get("asks")}
        start: Callable[..., Any] = self._engine.run  # takes_checkpoints(): a StreamingEngine's run
        run = start(checkpoint, producer.cancel, heartbeat_s=self._routes.append_window_s,
                    on_checkpoint=producer.save_checkpoint,
                    **options)
        producer.wake_with(run.set_heartbeat)
        return producer.drive(run.batches())


def _parsed(saved: SavedCheckpoint) -> Tuple[Dict[str, Any], Checkpoint]:
    """A saved checkpoint's record (the producer's context) and the engine's checkpoint in it."""
    record = json.loads(saved.data)
    return record, Checkpoint.from_json(record["checkpoint"])


def interrupted_calls(routes: RunRoutes, run_id: str, owner: str, after_seq: int, lease: Lease
                      ) -> Tuple[List[InterruptedCall], List[Tuple[ToolCall, bool]], int]:
    """The calls the log shows started after ``after_seq`` (with their logged results), those without a
    result (and whether they never ran), and the run's last seq.

    A ``tool_approved`` frame counts as a start: the approval was logged
    before the tool could run, so a worker that died between the two left it
    "maybe run".  A call only asked about (``approval_request``, no
    ``tool_start``) that no answer reached never ran: it is left out, so the
    resumed round asks again.  Raises :class:`RunLogError` when frames there
    were trimmed (what started cannot be known), or when the round was taken
    over ``MAX_TAKEOVERS`` times already (each worker that resumed it died).
    """
    started: Dict[str, Tuple[str, str]] = {}
    asked: Dict[str, bool] = {}  # call id -> whether a tool_start (or an approval) came too
    results: Dict[str, ToolResult] = {}
    skips: Dict[str, str] = {}
    takeovers = 0
    last = after_seq
    for item in read_to_end(routes.log, run_id, owner, after_seq):
        if isinstance(item, Gap):
            raise RunLogError(f"run {run_id!r}: frames after its checkpoint were trimmed, so the tool calls its "
                              "interrupted round started cannot be known")
        last = item.seq
        takeovers += item.name == "reset" and TAKEN_OVER in item.data
        call_id = _note(item, started, results, skips)
        if call_id:
            asked[call_id] = asked.get(call_id, False) or item.name != "approval_request"
    if takeovers >= MAX_TAKEOVERS:
        raise RunLogError(f"run {run_id!r}: its round was taken over {takeovers} times already and its worker died "
                          "each time; it is not taken over again")
    never_ran = {call_id for call_id, ran in asked.items()
                 if not ran and call_id not in results and routes.log.approval_answer(lease, call_id) is None}
    calls = [InterruptedCall(name, arguments, results.get(call_id), call_id, skips.get(call_id))
             for call_id, (name, arguments) in started.items() if call_id not in never_ran]
    open_calls = [(ToolCall(call_id, name, arguments), call_id in never_ran)
                  for call_id, (name, arguments) in started.items() if call_id not in results]
    return calls, open_calls, last


def close_open_calls(routes: RunRoutes, lease: Lease, errors: PublicErrors, calls: List[Tuple[ToolCall, bool]]) -> int:
    """One ``tool_result`` (``skipped: interrupted``) for each call the dead worker left without one; the last seq.

    So every frontend closes the call's card (it would spin for ever); 0 when there was none.
    """
    events = []
    for call, never_ran in calls:
        result = ToolResult.error_result(call, (
            f"interrupted: the worker asking about '{call.name}' stopped before an answer; it never ran, and is "
            "asked again" if never_ran else
            f"interrupted: the worker running '{call.name}' stopped before its result was logged; it may have "
            "taken effect, and is not run again"))
        event = log_event(errors.encode(ToolResultEvent(result, INTERRUPTED, call)))
        if event is not None:
            events.append(event)
    return routes.log.append(lease, events) if events else 0


def _note(frame: Frame, started: Dict[str, Tuple[str, str]], results: Dict[str, ToolResult],
          skips: Dict[str, str]) -> str:
    """A ``tool_start``, ``tool_approved`` or ``approval_request`` starts a call (its id is returned); a
    ``tool_result`` is its call's logged result (and ``skipped`` its reason when it was not run)."""
    data = frame_object(frame) if frame.name in _STARTS or frame.name == "tool_result" else None
    if data is None:
        return ""
    if frame.name == "tool_result":
        if isinstance(data.get("call_id"), str):
            results[data["call_id"]] = _logged_result(data)
            if isinstance(data.get("skipped"), str):
                skips[data["call_id"]] = data["skipped"]
        return ""
    call = frame_call(frame, data)
    if call:
        started.setdefault(call["id"], (str(call.get("name")), str(call.get("arguments") or "{}")))
    return str(call.get("id") or "")


def _logged_result(data: Dict[str, Any]) -> ToolResult:
    duration = data.get("duration_s")
    error = data.get("error")
    return ToolResult(str(data["call_id"]), str(data.get("name") or ""), bool(data.get("ok")),
                      str(data.get("text") or ""), str(error) if error is not None else None,
                      float(duration) if isinstance(duration, (int, float)) else 0.0)

