"""A run's state at a round boundary, as JSON: so another process can go on with the run from there.

A run started with ``engine.run(..., on_checkpoint=save)`` hands ``save`` a
:class:`Checkpoint` before its first round (round 0: the request) and each
time all tool results of a round are in and before the next round is asked
for.  ``engine.run(checkpoint, ...)`` goes on from one: the rounds number on,
usage, the safety counters and the limits (rounds, tool calls per request,
output) count on from what the checkpoint holds, and the run begins with a
``ResetEvent`` for the round that was interrupted, which is asked again.

Why it is built this way:

* **Round boundaries only.**  Between rounds a run is plain data: the
  messages the next round sends (the continuation, with its tool calls,
  tool results and :class:`~streamengine.ProviderItem` blocks), what the
  result gathers, the counters.  Mid-round state (a socket, running tools)
  cannot move to another process; the interrupted round is asked again.
* **Side effects are not run twice.**  ``Checkpoint.interrupted`` names the
  calls the interrupted round had started (its taker reads them from the
  run's log).  A side-effect call of the resumed round equal to one of them
  (same name, same canonical arguments) is not run again: it is answered by
  the result logged for it, or by an error saying it was interrupted and
  may have taken effect (``skipped: "interrupted"``).  Read-only tools run again.
* **What cannot be equal.**  The interrupted round's provider call is not in
  ``usage`` (it never finished), ``total_s`` counts the time before the
  checkpoint and after the resume (not the time between), and a resumed
  round's answer is a new answer of the model, not the lost one.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .._errors import ConfigError
from .._messages import Message, ProviderItem, ToolResult, Usage, as_message
from .result import Telemetry

if TYPE_CHECKING:  # pragma: no cover - rounds.py imports this module
    from .rounds import RoundRunner

#: The format of :meth:`Checkpoint.to_json`; a checkpoint of another version is refused.
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class InterruptedCall:
    """A call the interrupted round had started (its ``tool_start`` or ``approval_request`` was logged).

    ``result`` is the result logged for it, None when none was: the worker
    stopped while it ran, or after it was approved (it may have taken
    effect).  ``skipped`` is the logged result's reason when the call was
    not run (``"not_approved"`` ...).  ``call_id`` stays taken, so the resumed
    round never hands the same id to another call.
    """

    name: str
    arguments: str
    result: Optional[ToolResult] = None
    call_id: str = ""
    skipped: Optional[str] = None


@dataclass(frozen=True)
class Checkpoint:
    """A run at a round boundary; :meth:`to_json` and :meth:`from_json` carry it to another process.

    ``round`` rounds are complete (0: none, the run's request); ``messages``
    is what round ``round + 1`` sends.  The rest is what the result and the
    limits count on from.
    """

    round: int
    messages: Tuple[Message, ...]
    rounds: Tuple[str, ...] = ()
    reasoning_rounds: Tuple[str, ...] = ()
    tool_results: Tuple[ToolResult, ...] = ()
    usage: Optional[Usage] = None
    telemetry: Telemetry = field(default_factory=Telemetry)
    refusal: Optional[str] = None
    elapsed_s: float = 0.0
    call_ids: Tuple[str, ...] = ()  # every id the run's calls were told under: a resumed round's stay unique
    started: Tuple[Tuple[str, str], ...] = ()  # (name, canonical arguments) of calls that started: dedup
    tools_total: int = 0  # calls counted against max_tools_total
    output_left: Optional[int] = None  # EngineConfig.max_run_output_chars still to spend
    scope: str = ""  # the run's RAG scope
    interrupted: Tuple[InterruptedCall, ...] = ()

    def after_interruption(self, calls: Sequence[InterruptedCall]) -> Checkpoint:
        """This checkpoint, resumed after a round that started ``calls``: side-effect ones are not run again."""
        return dataclasses.replace(self, interrupted=tuple(calls))

    def to_json(self) -> str:
        """One line of JSON (ASCII): everything :meth:`from_json` needs, nothing that is not data."""
        payload = {
            "version": CHECKPOINT_VERSION, "round": self.round,
            "messages": [_message_json(message) for message in self.messages],
            "rounds": list(self.rounds), "reasoning_rounds": list(self.reasoning_rounds),
            "tool_results": [dataclasses.asdict(result) for result in self.tool_results],
            "usage": dataclasses.asdict(self.usage) if self.usage is not None else None,
            "telemetry": dataclasses.asdict(self.telemetry), "refusal": self.refusal,
            "elapsed_s": self.elapsed_s, "call_ids": list(self.call_ids),
            "started": [list(key) for key in self.started], "tools_total": self.tools_total,
            "output_left": self.output_left, "scope": self.scope,
            "interrupted": [{"name": call.name, "arguments": call.arguments,
                             "result": dataclasses.asdict(call.result) if call.result is not None else None,
                             "call_id": call.call_id, "skipped": call.skipped}
                            for call in self.interrupted],
        }
        return json.dumps(payload, ensure_ascii=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        """The checkpoint ``text`` holds; a :class:`ConfigError` saying what is wrong when it is not one."""
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
            if raw.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, this engine reads version {CHECKPOINT_VERSION}")
            return cls._parsed(raw)
        except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, ConfigError) as exc:
            raise ConfigError(f"not a run checkpoint this engine can resume ({type(exc).__name__}: {exc}); "
                              "start the run again from its messages") from exc

    @classmethod
    def _parsed(cls, raw: Mapping[str, Any]) -> Checkpoint:
        round_no = raw["round"]
        if not isinstance(round_no, int) or round_no < 0:
            raise ValueError(f"round must be a count, got {round_no!r}")
        messages = tuple(_message_of(item) for item in _list(raw, "messages"))
        if not messages:
            raise ValueError("it has no messages")
        usage = raw.get("usage")
        output_left = raw.get("output_left")
        interrupted = tuple(InterruptedCall(str(item["name"]), str(item["arguments"]),
                                            _result_of(item["result"]) if item.get("result") else None,
                                            str(item.get("call_id") or ""),
                                            str(item["skipped"]) if item.get("skipped") else None)
                            for item in _list(raw, "interrupted"))
        return cls(round=round_no, messages=messages, rounds=tuple(map(_text, _list(raw, "rounds"))),
                   reasoning_rounds=tuple(map(_text, _list(raw, "reasoning_rounds"))),
                   tool_results=tuple(_result_of(item) for item in _list(raw, "tool_results")),
                   usage=Usage(**_fields(usage, Usage)) if usage is not None else None,
                   telemetry=_telemetry_of(raw["telemetry"]), refusal=_optional_text(raw.get("refusal")),
                   elapsed_s=float(raw.get("elapsed_s") or 0.0), call_ids=tuple(map(_text, _list(raw, "call_ids"))),
                   started=tuple((_text(key[0]), _text(key[1])) for key in _list(raw, "started")),
                   tools_total=int(raw.get("tools_total") or 0),
                   output_left=int(output_left) if output_left is not None else None,
                   scope=_text(raw.get("scope") or ""), interrupted=interrupted)


# --- taking a checkpoint from a run, and putting one back (RoundRunner calls these) -------------------------------

def snapshot(runner: RoundRunner, completed: int, elapsed_s: float) -> Checkpoint:
    """The run's state now, after ``completed`` rounds (0: before the first, the request as given)."""
    state, calls = runner.state, runner.calls
    telemetry = _telemetry_copy(state.telemetry,
                                parse_errors=state.telemetry.parse_errors + runner.parse_errors_pending)
    return Checkpoint(
        round=completed, messages=tuple(state.conversation if completed == 0 else runner.messages),
        rounds=tuple(state.rounds), reasoning_rounds=tuple(state.reasoning_rounds), tool_results=tuple(state.results),
        usage=state.usage, telemetry=telemetry, refusal=state.refusal, elapsed_s=elapsed_s,
        call_ids=tuple(sorted(calls.taken_ids)), started=tuple(calls.started_keys), tools_total=calls.total,
        output_left=runner.output_left, scope=state.scope)


def restore_state(runner: RoundRunner, checkpoint: Checkpoint) -> None:
    """What the run had gathered before the checkpoint, back in its state (before its ToolCalls exist)."""
    state = runner.state
    state.telemetry = _telemetry_copy(checkpoint.telemetry)
    state.rounds[:] = checkpoint.rounds
    state.reasoning_rounds[:] = checkpoint.reasoning_rounds
    state.results[:] = checkpoint.tool_results
    state.usage, state.refusal = checkpoint.usage, checkpoint.refusal
    if checkpoint.output_left is not None:
        runner.output_left = checkpoint.output_left


def _telemetry_copy(telemetry: Telemetry, **changes: Any) -> Telemetry:
    """``telemetry`` with lists of its own: the run goes on appending to them, a checkpoint must not move."""
    return dataclasses.replace(telemetry, finish_reasons=list(telemetry.finish_reasons),
                               failed_attempts=list(telemetry.failed_attempts), **changes)


def _message_json(message: Message) -> Dict[str, Any]:
    out = message.to_openai()
    if message.provider_items:
        out["provider_items"] = [{"wire": item.wire, "data": dict(item.data), "size": item.size}
                                 for item in message.provider_items]
    return out


def _message_of(raw: Any) -> Message:
    if not isinstance(raw, dict):
        raise ValueError(f"a message is a JSON object, got {type(raw).__name__}")
    items = tuple(ProviderItem(str(item["wire"]), dict(item["data"]), int(item.get("size", -1)))
                  for item in raw.get("provider_items") or ())
    message = as_message({key: value for key, value in raw.items() if key != "provider_items"})
    return dataclasses.replace(message, provider_items=items)


def _result_of(raw: Any) -> ToolResult:
    fields = _fields(raw, ToolResult)
    for name in ("call_id", "name", "text"):
        fields[name] = _text(fields.get(name, ""))
    fields["ok"] = bool(fields.get("ok"))
    return ToolResult(**fields)


def _telemetry_of(raw: Any) -> Telemetry:
    fields = _fields(raw, Telemetry)
    fields["finish_reasons"] = list(fields.get("finish_reasons") or [])
    fields["failed_attempts"] = [_text(line) for line in fields.get("failed_attempts") or []]
    return Telemetry(**fields)


def _fields(raw: Any, kind: type) -> Dict[str, Any]:
    """The keys of ``raw`` that are fields of the dataclass ``kind`` (a newer writer's extras are left out)."""
    if not isinstance(raw, dict):
        raise ValueError(f"a {kind.__name__} is a JSON object, got {type(raw).__name__}")
    names = {f.name for f in dataclasses.fields(kind)}
    return {key: value for key, value in raw.items() if key in names}


def _list(raw: Mapping[str, Any], key: str) -> List[Any]:
    value = raw.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list, got {type(value).__name__}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _optional_text(value: Any) -> Optional[str]:
    return None if value is None else _text(value)
