"""Scenario files: scripted provider turns, tools and expectations, run over real HTTP.

``streamengine harness SCENARIO.json ...`` runs each scenario against its own
:class:`~streamengine.testing.FakeProvider` on loopback, through the real
client and engine, and checks what came out.  A scenario file is one JSON
object (unknown keys are errors, so a typo never silently skips a check)::

    {
      "name": "inline tools mid-stream",        # default: the file name
      "prompt": "What's the weather?",          # the user message (default "hello")
      "system": "You are terse.",               # optional system message
      "framing": "chunked",                     # chunked | close | length (FakeProvider)
      "turns": [                                # one list of steps per provider request
        [{"text": "Checking "}, {"delay": 0.1},
         {"text": "<tool name=\\"lookup\\">{\\"q\\": \\"x\\"}</tool>"}, {"text": " more"}],
        [{"text": "Final answer."}]
      ],
      "tools": [
        {"fake": "sleep", "name": "lookup", "seconds": 0.2, "params": {"q": "string"}},
        {"import": "mypackage.tools:TOOLS"}
      ],
      "config": {"models": ["m1", "m2"], "tool_timeout": 1.0},
      "expect": {
        "events": ["round", "tool_start", "token", "tool_result", "round", "done"],
        "tools_started_before_stream_end": true,
        "answer_contains": ["Final"], "answer_not_contains": ["error"],
        "answer_equals": "Final answer.",
        "telemetry": {"tools_ok": 1, "rounds": 2},
        "requests": 2,
        "requested_models": ["m1", "m1"],
        "request_contains": {"1": ["lookup"]},
        "error": false
      }
    }

**Steps** (each an object with one key) map to ``streamengine.testing._steps``:
``{"text": s}``, ``{"reasoning": s}``, ``{"delay": seconds}``,
``{"tool_call": {"index": 0, "id": .., "name": .., "arguments": str or object}}``,
``{"finish": "stop"}``, ``{"usage": {"prompt": 1, "completion": 1}}``,
``{"done": true}``, ``{"http_error": {"status": 503, "body": {...} or str,
"headers": {...}}}``, ``{"drop": true}``, ``{"stall": true}``,
``{"stall_before_headers": true}``, ``{"end": true}``, ``{"comment": s}``,
``{"ping": true}``, ``{"empty_delta": true}``, ``{"raw": s}``,
``{"error_frame": {"message": s, "type": .., "code": ..}}``.  A turn with no
terminal step (done/end/stall/drop/http_error/stall_before_headers) gets
``finish`` + ``usage`` + ``[DONE]``, as ``FakeProvider`` does.

**Approval**: ``{"approve": {"send_email": true, "delete_all": false}}`` in a
turn is no step the provider sends: it answers the engine's ``approve`` for
the side-effect calls that turn's answer makes, by tool name.  A side-effect
call it does not name is refused, as the command line refuses without a yes.

**Tools**: ``{"fake": KIND, "name": NAME, ...}`` with KIND ``echo`` (returns
``result``, else its arguments as JSON), ``sleep`` (sleeps ``seconds``
through ``ToolContext.sleep``, so a cancel stops it, then answers like echo),
``fail`` (raises ``ToolError(message)``) or ``hang`` (blocks and ignores its
cancel flag, like a stuck network call, until the scenario ends or ``seconds``
(default 60) pass); options ``params`` (argument name -> JSON type: string,
integer, number, boolean, array, object, any; all required), ``timeout``,
``side_effects``, ``description``, ``result``, ``message``, ``seconds``.  Or
``{"import": "module:attr"}``: a Tool, a function, or a list/tuple/registry of them.

**Config**: any :class:`~streamengine.EngineConfig` field (``options`` as an object of ``CompletionOptions``
fields).  Harness defaults: ``models ["fake-model"]``, ``idle_timeout 10``, ``completion_timeout 30``.

**Expectations** (all optional): ``events`` must appear in this order as a
subsequence of the run's event names (round, token, tool_start, tool_result,
error, done); ``tools_started_before_stream_end`` — ``true``: every tool that
ran started before the provider finished writing the stream of the round that
called it; ``false``: every one started after (side-effect tools); a list of
tool names: those did.  The end of each stream is stamped by a ``signal``
step the harness adds to each turn, compared with ``ToolResult.started_at``
(both ``time.monotonic()``).  ``telemetry``: exact values of
:class:`~streamengine.Telemetry` fields.  ``requests``: how many chat
requests the provider got; ``requested_models``: their ``model`` fields;
``request_contains``: request index -> substrings of its JSON ``messages``;
``error``: ``false`` (no error), ``true`` (the run ended with an error) or a
substring of the error.

Every error in a file names the file and the JSON path (``$.turns[0][2]``).
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from .._clients.openai import OpenAICompatibleClient
from .._config import EngineConfig
from .._engine.events import DoneEvent, Event, HeartbeatEvent, TokenEvent, ToolResultEvent, ToolStartEvent
from .._engine.result import EngineResult, Telemetry
from .._engine.run import StreamingEngine
from .._errors import ConfigError, StreamEngineError, ToolError
from .._messages import CompletionOptions, StopReason
from .._validation import one_line as _one_line
from .._validation import short_repr as _short
from ..tools import Tool, ToolContext
from ..tools._tool import load_tools
from . import _steps as s
from ._provider import FakeProvider, Framing
from ._steps import Stamp, Step

EVENT_NAMES = ("round", "token", "tool_start", "tool_result", "error", "done")
FAKE_KINDS = ("echo", "sleep", "fail", "hang")
_TERMINAL = frozenset({"done", "end", "stall", "drop", "http_error", "stall_before_headers"})
_ENDS_BEFORE = frozenset({"end", "stall", "drop"})  # the stream stops at this step: stamp before it
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
               "object": dict, "any": Any}
_DEFAULT_CONFIG = {"models": ["fake-model"], "idle_timeout": 10.0, "completion_timeout": 30.0}
_TOP_KEYS = ("name", "description", "prompt", "system", "framing", "turns", "tools", "config", "expect")
_EXPECT_KEYS = ("events", "tools_started_before_stream_end", "answer_contains", "answer_not_contains",
                "answer_equals", "telemetry", "requests", "requested_models", "request_contains", "error")
_TELEMETRY_FIELDS = tuple(f.name for f in dataclasses.fields(Telemetry))
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig))


class ScenarioError(ConfigError):
    """A scenario file that cannot be read or does not follow the format; names file and JSON path."""


# --------------------------------------------------------------------------- importing tools



# --------------------------------------------------------------------------- the file format

class _Where:
    """A position in a scenario file, for error messages: ``file: $.turns[0][2]: ...``."""

    def __init__(self, source: str, path: str = "$") -> None:
        self.source, self.path = source, path

    def key(self, name: str) -> _Where:
        return _Where(self.source, f"{self.path}.{name}")

    def index(self, i: int) -> _Where:
        return _Where(self.source, f"{self.path}[{i}]")

    def error(self, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {self.path}: {message}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _need(where: _Where, value: Any, types: Tuple[type, ...], wanted: str) -> Any:
    if isinstance(value, bool) and bool not in types:
        raise where.error(f"must be {wanted}, got {_kind(value)}")
    if not isinstance(value, types):
        raise where.error(f"must be {wanted}, got {_kind(value)}")
    return value


def _need_seconds(where: _Where, value: Any) -> float:
    _need(where, value, (int, float), "a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise where.error(f"must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _need_keys(where: _Where, obj: Mapping[str, Any], allowed: Sequence[str]) -> None:
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise where.key(unknown[0]).error(f"unknown key; allowed here: {', '.join(allowed)}")


def _str_list(where: _Where, value: Any) -> List[str]:
    if isinstance(value, str):
        return [value]
    _need(where, value, (list,), "a string or a list of strings")
    for i, item in enumerate(value):
        _need(where.index(i), item, (str,), "a string")
    return list(value)


@dataclass(frozen=True)
class FakeTool:
    """A built-in fake tool from a scenario; built fresh per run (``hang`` needs the run's release event)."""

    kind: str
    name: str
    seconds: Optional[float] = None
    params: Tuple[Tuple[str, str], ...] = ()
    timeout: Optional[float] = None
    side_effects: bool = False
    description: Optional[str] = None
    result: Optional[str] = None
    message: Optional[str] = None

    def build(self, release: threading.Event) -> Tool:
        body = self._body(release)
        parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=ToolContext)]
        annotations: Dict[str, Any] = {"ctx": ToolContext, "return": str}
        for pname, ptype in self.params:
            parameters.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, annotation=_JSON_TYPES[ptype]))
            annotations[pname] = _JSON_TYPES[ptype]

        def fake(**kwargs: Any) -> str:
            return body(kwargs.pop("ctx"), kwargs)

        fake.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]  # read by inspect.signature
        fake.__annotations__ = annotations
        fake.__name__ = self.name
        description = self.description if self.description is not None else f"Scenario fake tool ({self.kind})."
        return Tool(fake, name=self.name, description=description, timeout=self.timeout,
                    side_effects=self.side_effects)

    def _answer(self, args: Dict[str, Any]) -> str:
        return self.result if self.result is not None else json.dumps(args, sort_keys=True)

    def _body(self, release: threading.Event) -> Callable[[ToolContext, Dict[str, Any]], str]:
        if self.kind == "echo":
            return lambda ctx, args: self._answer(args)
        if self.kind == "sleep":
            def sleep(ctx: ToolContext, args: Dict[str, Any]) -> str:
                if not ctx.sleep(self.seconds if self.seconds is not None else 0.1):
                    raise ToolError("cancelled")
                return self._answer(args)
            return sleep
        if self.kind == "fail":
            def fail(ctx: ToolContext, args: Dict[str, Any]) -> str:
                raise ToolError(self.message or f"fake tool {self.name!r} failed as the scenario asked")
            return fail

        def hang(ctx: ToolContext, args: Dict[str, Any]) -> str:
            # Deliberately deaf to ctx: the engine must abandon it at its deadline.
            release.wait(self.seconds if self.seconds is not None else 60.0)
            return "hang released"
        return hang


@dataclass(frozen=True)
class Scenario:
    """A validated scenario file."""

    name: str
    source: str
    turns: Tuple[Tuple[Step, ...], ...]
    fakes: Tuple[FakeTool, ...]
    imported: Tuple[Tool, ...]
    config: EngineConfig
    #: Per turn: tool name -> whether its side-effect calls in that turn's answer run.
    approvals: Tuple[Mapping[str, bool], ...] = ()
    prompt: str = "hello"
    system: Optional[str] = None
    framing: Framing = "chunked"
    expect: Mapping[str, Any] = field(default_factory=dict)


def load_scenario(path: str) -> Scenario:
    """Read and validate one scenario file; :class:`ScenarioError` names the file and JSON path."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        line, col = getattr(exc, "lineno", "?"), getattr(exc, "colno", "?")
        raise ScenarioError(f"{path}: line {line} column {col}: invalid JSON: {getattr(exc, 'msg', exc)}") from exc
    return parse_scenario(data, path)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate already-parsed JSON (``source`` names it in errors)."""
    root = _Where(source)
    _need(root, data, (dict,), "a JSON object with 'turns' (see streamengine.testing._scenario)")
    _need_keys(root, data, _TOP_KEYS)
    if "turns" not in data:
        raise root.error("missing 'turns': a list of provider turns, each a list of steps")
    name = data.get("name", os.path.splitext(os.path.basename(source))[0])
    _need(root.key("name"), name, (str,), "a string")
    prompt = _need(root.key("prompt"), data.get("prompt", "hello"), (str,), "a string")
    system = data.get("system")
    if system is not None:
        _need(root.key("system"), system, (str,), "a string")
    framing = _need(root.key("framing"), data.get("framing", "chunked"), (str,), "a string")
    if framing not in ("chunked", "close", "length"):
        raise root.key("framing").error(f"must be chunked, close or length, got {framing!r}")
    turns, approvals = _parse_turns(root.key("turns"), data["turns"])
    fakes, imported = _parse_tools(root.key("tools"), data.get("tools", []))
    config = _parse_config(root.key("config"), data.get("config", {}))
    expect = _parse_expect(root.key("expect"), data.get("expect", {}))
    return Scenario(name=name, source=source, turns=turns, fakes=fakes, imported=imported, config=config,
                    approvals=approvals, prompt=prompt, system=system, framing=framing, expect=expect)


def _parse_turns(where: _Where, value: Any) -> Tuple[Tuple[Tuple[Step, ...], ...], Tuple[Mapping[str, bool], ...]]:
    """Each turn's steps for the provider, and its ``approve`` answers (taken out of the steps)."""
    _need(where, value, (list,), "a list of turns (each a list of steps)")
    if not value:
        raise where.error("needs at least one turn")
    turns, approvals = [], []
    for i, turn in enumerate(value):
        at = where.index(i)
        _need(at, turn, (list,), "a list of steps")
        steps, approve = [], {}
        for j, step in enumerate(turn):
            if isinstance(step, dict) and set(step) == {"approve"}:
                approve.update(_parse_approve(at.index(j).key("approve"), step["approve"]))
            else:
                steps.append(_parse_step(at.index(j), step))
        turns.append(tuple(steps))
        approvals.append(approve)
    return tuple(turns), tuple(approvals)


def _parse_approve(where: _Where, value: Any) -> Dict[str, bool]:
    _need(where, value, (dict,), "an object of tool name -> true or false")
    for name, answer in value.items():
        _need(where.key(name), answer, (bool,), "true or false")
    return dict(value)


_FLAG_STEPS = {"done": s.done, "drop": s.drop, "stall": s.stall, "stall_before_headers": s.stall_before_headers,
               "end": s.end, "ping": s.ping_event, "empty_delta": s.empty_delta}
_STEP_KEYS = ("text", "reasoning", "delay", "tool_call", "finish", "usage", "http_error", "comment", "raw",
              "error_frame", "approve") + tuple(_FLAG_STEPS)


def _parse_step(where: _Where, step: Any) -> Step:
    _need(where, step, (dict,), "a step object such as {\"text\": \"...\"}")
    if len(step) != 1:
        raise where.error(f"a step has exactly one key (one of {', '.join(_STEP_KEYS)}), got {sorted(step)}")
    key, value = next(iter(step.items()))
    at = where.key(key)
    if key not in _STEP_KEYS:
        raise at.error(f"unknown step; steps: {', '.join(_STEP_KEYS)}")
    if key in ("text", "reasoning", "comment", "raw"):
        _need(at, value, (str,), "a string")
        makers: Dict[str, Callable[[str], Step]] = {"text": s.text, "reasoning": s.reasoning,
                                                    "comment": s.comment, "raw": s.raw}
        return makers[key](value)
    if key == "delay":
        return s.delay(_need_seconds(at, value))
    if key == "finish":
        return s.finish(_need(at, value, (str,), "a finish reason such as \"stop\""))
    if key in _FLAG_STEPS:
        if value is not True:
            raise at.error(f"must be true, got {json.dumps(value)}")
        return _FLAG_STEPS[key]()
    _need(at, value, (dict,), "an object")
    if key == "tool_call":
        return _tool_call_step(at, value)
    if key == "usage":
        _need_keys(at, value, ("prompt", "completion"))
        counts = [_need(at.key(k), value.get(k, 1), (int,), "an integer") for k in ("prompt", "completion")]
        return s.usage(*counts)
    if key == "http_error":
        return _http_error_step(at, value)
    _need_keys(at, value, ("message", "type", "code"))  # error_frame
    message = _need(at.key("message"), value.get("message"), (str,), "a string")
    return s.error_frame(message, value.get("type"), value.get("code"))


def _tool_call_step(at: _Where, value: Mapping[str, Any]) -> Step:
    _need_keys(at, value, ("index", "id", "name", "arguments"))
    index = _need(at.key("index"), value.get("index", 0), (int,), "an integer")
    ident, name = value.get("id"), value.get("name")
    for key, item in (("id", ident), ("name", name)):
        if item is not None:
            _need(at.key(key), item, (str,), "a string")
    arguments = value.get("arguments")
    if isinstance(arguments, (dict, list)):
        arguments = json.dumps(arguments)
    elif arguments is not None:
        _need(at.key("arguments"), arguments, (str,), "a JSON text or an object")
    return s.tool_call(index, ident, name, arguments)


def _http_error_step(at: _Where, value: Mapping[str, Any]) -> Step:
    _need_keys(at, value, ("status", "body", "headers", "content_type"))
    status = _need(at.key("status"), value.get("status"), (int,), "an HTTP status code")
    if not 400 <= status <= 599:
        raise at.key("status").error(f"must be an HTTP error status (400-599), got {status}")
    headers = _need(at.key("headers"), value.get("headers", {}), (dict,), "an object of header names to values")
    for name, item in headers.items():
        _need(at.key("headers").key(name), item, (str,), "a string")
    content_type = _need(at.key("content_type"), value.get("content_type", "application/json"), (str,), "a string")
    return s.http_error(status, value.get("body"), headers, content_type)


def _parse_tools(where: _Where, value: Any) -> Tuple[Tuple[FakeTool, ...], Tuple[Tool, ...]]:
    _need(where, value, (list,), "a list of tools")
    fakes: List[FakeTool] = []
    imported: List[Tool] = []
    names: Set[str] = set()
    for i, item in enumerate(value):
        at = where.index(i)
        _need(at, item, (dict,), "an object: {\"fake\": ...} or {\"import\": \"module:attr\"}")
        if "import" in item:
            _need_keys(at, item, ("import",))
            spec = _need(at.key("import"), item["import"], (str,), "a 'module:attr' string")
            try:
                tools = load_tools(spec, what="import")
            except ConfigError as exc:
                raise at.key("import").error(str(exc)) from exc
            new: Sequence[Union[Tool, FakeTool]] = tools
        else:
            fake = _parse_fake(at, item)
            fakes.append(fake)
            new = [fake]
        for tool in new:
            if tool.name in names:
                raise at.error(f"a second tool named {tool.name!r}; tool names must be unique")
            names.add(tool.name)
        imported.extend(t for t in new if isinstance(t, Tool))
    return tuple(fakes), tuple(imported)


def _parse_fake(at: _Where, item: Mapping[str, Any]) -> FakeTool:
    _need_keys(at, item, ("fake", "name", "seconds", "params", "timeout", "side_effects", "description",
                          "result", "message"))
    kind = item.get("fake")
    if kind not in FAKE_KINDS:
        raise at.key("fake").error(f"must be one of {', '.join(FAKE_KINDS)}, got {json.dumps(kind)}")
    name = _need(at.key("name"), item.get("name"), (str,), "a tool name")
    params = _need(at.key("params"), item.get("params", {}), (dict,), "an object of argument name -> JSON type")
    for pname, ptype in params.items():
        if ptype not in _JSON_TYPES:
            raise at.key("params").key(pname).error(f"must be one of {', '.join(_JSON_TYPES)}, got {json.dumps(ptype)}")
        if pname == "ctx" or not pname.isidentifier():
            raise at.key("params").key(pname).error("must be a Python identifier other than 'ctx'")
    seconds = item.get("seconds")
    timeout = item.get("timeout")
    fake = FakeTool(
        kind=kind, name=name,
        seconds=None if seconds is None else _need_seconds(at.key("seconds"), seconds),
        params=tuple(params.items()),
        timeout=None if timeout is None else _need_seconds(at.key("timeout"), timeout),
        side_effects=_need(at.key("side_effects"), item.get("side_effects", False), (bool,), "true or false"),
        description=_optional_str(at.key("description"), item.get("description")),
        result=_optional_str(at.key("result"), item.get("result")),
        message=_optional_str(at.key("message"), item.get("message")),
    )
    try:
        fake.build(threading.Event())
    except StreamEngineError as exc:
        raise at.error(_one_line(str(exc))) from exc
    return fake


def _optional_str(where: _Where, value: Any) -> Optional[str]:
    return None if value is None else _need(where, value, (str,), "a string")


def _parse_config(where: _Where, value: Any) -> EngineConfig:
    _need(where, value, (dict,), "an object of EngineConfig fields")
    _need_keys(where, value, _CONFIG_FIELDS)
    fields_ = dict(_DEFAULT_CONFIG, **value)
    if "options" in value and value["options"] is not None:
        options = _need(where.key("options"), value["options"], (dict,), "an object of CompletionOptions fields")
        _need_keys(where.key("options"), options, tuple(f.name for f in dataclasses.fields(CompletionOptions)))
        fields_["options"] = CompletionOptions(**options)
    try:
        return EngineConfig(**fields_)
    except (ConfigError, TypeError) as exc:
        raise where.error(_one_line(str(exc))) from exc


def _parse_expect(where: _Where, value: Any) -> Dict[str, Any]:
    _need(where, value, (dict,), "an object of expectations")
    _need_keys(where, value, _EXPECT_KEYS)
    out = dict(value)
    if "events" in value:
        for i, name in enumerate(_str_list(where.key("events"), value["events"])):
            if name not in EVENT_NAMES:
                raise where.key("events").index(i).error(f"unknown event {name!r}; events: {', '.join(EVENT_NAMES)}")
        out["events"] = _str_list(where.key("events"), value["events"])
    if "tools_started_before_stream_end" in value:
        flag = value["tools_started_before_stream_end"]
        if not isinstance(flag, bool):
            out["tools_started_before_stream_end"] = _str_list(where.key("tools_started_before_stream_end"), flag)
    for key in ("answer_contains", "answer_not_contains"):
        if key in value:
            out[key] = _str_list(where.key(key), value[key])
    if "answer_equals" in value:
        _need(where.key("answer_equals"), value["answer_equals"], (str,), "a string")
    if "telemetry" in value:
        _need(where.key("telemetry"), value["telemetry"], (dict,), "an object of Telemetry fields")
        _need_keys(where.key("telemetry"), value["telemetry"], _TELEMETRY_FIELDS)
    if "requests" in value:
        _need(where.key("requests"), value["requests"], (int,), "an integer")
    if "requested_models" in value:
        out["requested_models"] = _str_list(where.key("requested_models"), value["requested_models"])
    if "request_contains" in value:
        table = _need(where.key("request_contains"), value["request_contains"], (dict,),
                      "an object: request index -> list of substrings")
        parsed = {}
        for key, texts in table.items():
            if not key.isdigit():
                raise where.key("request_contains").key(key).error("keys are request indexes (\"0\", \"1\", ...)")
            parsed[int(key)] = _str_list(where.key("request_contains").key(key), texts)
        out["request_contains"] = parsed
    if "error" in value:
        _need(where.key("error"), value["error"], (bool, str), "true, false or a substring of the error")
    return out


# --------------------------------------------------------------------------- running

def _stamped(turn: Sequence[Step], begin: Stamp, end: Stamp) -> List[Step]:
    """The turn with a begin stamp first and an end stamp where its stream stops."""
    body = list(turn)
    if not any(step.kind in _TERMINAL for step in body):
        has_calls = any(step.kind == "delta" and "tool_calls" in step.value for step in body)
        if not any(step.kind == "finish" for step in body):
            body.append(s.finish(StopReason.TOOL_CALLS if has_calls else StopReason.STOP))
        if not any(step.kind == "usage" for step in body):
            body.append(s.usage())
        body.append(s.done())
    out = [s.signal(begin)]
    for step in body:
        if step.kind in _ENDS_BEFORE:
            out.append(s.signal(end))
        out.append(step)
        if step.kind == "done":
            out.append(s.signal(end))
    return out


@dataclass
class ScenarioResult:
    """The outcome of one scenario: ``failures`` empty means it passed; ``error`` = it could not run."""

    name: str
    source: str
    duration_s: float
    failures: List[str] = field(default_factory=list)
    error: Optional[str] = None
    transcript: str = ""

    @property
    def passed(self) -> bool:
        return not self.failures and self.error is None

    @property
    def reason(self) -> str:
        return self.error if self.error is not None else "; ".join(self.failures)


@dataclass
class _Run:
    events: List[Event]
    stamps: List[Tuple[Stamp, Stamp]]
    requests: List[Any]

    @property
    def result(self) -> Optional[EngineResult]:
        last = self.events[-1] if self.events else None
        return last.result if isinstance(last, DoneEvent) else None


def run_scenario(scenario: Scenario) -> ScenarioResult:
    """Run one scenario against its own FakeProvider; never raises for a scenario's fault."""
    started = time.monotonic()
    try:
        run = _execute(scenario)
    except StreamEngineError as exc:
        return ScenarioResult(scenario.name, scenario.source, time.monotonic() - started,
                              error=f"could not run: {_one_line(str(exc))}")
    except Exception as exc:  # a bug in an imported tool module or here: report, keep going
        return ScenarioResult(scenario.name, scenario.source, time.monotonic() - started,
                              error=f"crashed: {type(exc).__name__}: {_one_line(str(exc))}")
    failures = check_expectations(scenario.expect, run)
    return ScenarioResult(scenario.name, scenario.source, time.monotonic() - started, failures=failures,
                          transcript=_transcript(run.events))


def _execute(scenario: Scenario) -> _Run:
    release = threading.Event()
    stamps: List[Tuple[Stamp, Stamp]] = []
    messages = ([{"role": "system", "content": scenario.system}] if scenario.system else []) + \
        [{"role": "user", "content": scenario.prompt}]
    with FakeProvider(framing=scenario.framing) as fp:
        for turn in scenario.turns:
            begin, end = Stamp(), Stamp()
            stamps.append((begin, end))
            fp.add_turn(*_stamped(turn, begin, end), auto_finish=False)
        tools = [fake.build(release) for fake in scenario.fakes] + list(scenario.imported)
        client = OpenAICompatibleClient(fp.base_url)
        try:
            engine = StreamingEngine(client, tools, scenario.config, approve=_approver(scenario, fp))
            try:
                events: List[Event] = [e for e in engine.run(messages) if not isinstance(e, HeartbeatEvent)]
            finally:
                release.set()  # free 'hang' tools before the pool is joined
                engine.close()
        finally:
            client.close()
        return _Run(events, stamps, [r for r in fp.requests if r.path.rstrip("/").endswith("/chat/completions")])


def _approver(scenario: Scenario, fp: FakeProvider) -> Callable[[Any], bool]:
    """The scenario's ``approve`` answers for the turn whose answer made the call; unnamed calls refused.

    The engine asks once the round's stream finished, so the turn is the one
    that answered the latest chat request.
    """
    def approve(call: Any) -> bool:
        asked = sum(1 for r in fp.requests if r.path.rstrip("/").endswith("/chat/completions"))
        table = scenario.approvals[asked - 1] if 0 < asked <= len(scenario.approvals) else {}
        return table.get(call.name, False)
    return approve


# --------------------------------------------------------------------------- checking

def check_expectations(expect: Mapping[str, Any], run: _Run) -> List[str]:
    """Every unmet expectation, as a sentence; empty when all hold."""
    result = run.result
    if result is None:
        return [f"the run did not end with a done event (events: {_compact([e.name for e in run.events])})"]
    failures: List[str] = []
    names = [e.name for e in run.events]
    if "events" in expect:
        failures += _check_events(expect["events"], names)
    if "tools_started_before_stream_end" in expect:
        failures += _check_overlap(expect["tools_started_before_stream_end"], run)
    failures += _check_answer(expect, result.answer)
    for key, wanted in expect.get("telemetry", {}).items():
        got = getattr(result.telemetry, key)
        if got != wanted:
            failures.append(f"telemetry.{key} is {json.dumps(got)}, expected {json.dumps(wanted)}")
    if "requests" in expect and len(run.requests) != expect["requests"]:
        failures.append(f"the provider got {len(run.requests)} chat request(s), expected {expect['requests']}")
    if "requested_models" in expect:
        models = [(r.json or {}).get("model") for r in run.requests]
        if models != expect["requested_models"]:
            failures.append(f"requested models were {models}, expected {expect['requested_models']}")
    for index, texts in expect.get("request_contains", {}).items():
        failures += _check_request(index, texts, run.requests)
    if "error" in expect:
        failures += _check_error(expect["error"], result.error)
    return failures


def _check_events(wanted: Sequence[str], names: Sequence[str]) -> List[str]:
    position = 0
    for i, name in enumerate(wanted):
        try:
            position = names.index(name, position) + 1
        except ValueError:
            return [f"events: expected {wanted[:i + 1]} in order, but no {name!r} after the first "
                    f"{i} matched; got {_compact(names)}"]
    return []


def _ran(events: Sequence[Event]) -> List[Any]:
    """Results of the calls that really started (skipped calls carry timestamps too, but no tool_start)."""
    started = {e.call.id for e in events if isinstance(e, ToolStartEvent)}
    return [e.result for e in events if isinstance(e, ToolResultEvent) and e.result.call_id in started]


def _check_overlap(wanted: Any, run: _Run) -> List[str]:
    ran = _ran(run.events)
    stamps = run.stamps
    if not ran:
        return ["tools_started_before_stream_end: no tool ran, so there is nothing to compare"]
    verdicts = []
    for r in ran:
        begun = [(b.at, e.at) for b, e in stamps if b.at is not None and b.at <= r.started_at]
        if not begun:
            verdicts.append((r.name, False, "started before any stream began"))
            continue
        _, end_at = max(begun, key=lambda pair: pair[0])
        if end_at is None or r.started_at < end_at:
            lead = "while the stream was still open" if end_at is None else f"{end_at - r.started_at:.3f}s before"
            verdicts.append((r.name, True, f"started {lead}"))
        else:
            verdicts.append((r.name, False, f"started {r.started_at - end_at:.3f}s after its stream ended"))
    if wanted is True:
        bad = [f"{n} {why}" for n, ok, why in verdicts if not ok]
    elif wanted is False:
        bad = [f"{n} {why}" for n, ok, why in verdicts if ok]
    else:
        bad = [f"{n} {why}" for n, ok, why in verdicts if n in wanted and not ok]
        bad += [f"{n} never ran" for n in wanted if n not in {v[0] for v in verdicts}]
    return [f"tools_started_before_stream_end={json.dumps(wanted)}: " + "; ".join(bad)] if bad else []


def _check_answer(expect: Mapping[str, Any], answer: str) -> List[str]:
    failures = []
    for text in expect.get("answer_contains", ()):
        if text not in answer:
            failures.append(f"answer does not contain {text!r}; answer: {_excerpt(answer)}")
    for text in expect.get("answer_not_contains", ()):
        if text in answer:
            failures.append(f"answer contains {text!r}; answer: {_excerpt(answer)}")
    if "answer_equals" in expect and answer != expect["answer_equals"]:
        failures.append(f"answer is {_excerpt(answer)}, expected {_excerpt(expect['answer_equals'])}")
    return failures


def _check_request(index: int, texts: Sequence[str], requests: Sequence[Any]) -> List[str]:
    if index >= len(requests):
        return [f"request_contains: there is no request {index} (the provider got {len(requests)})"]
    body = json.dumps((requests[index].json or {}).get("messages"), ensure_ascii=False)
    return [f"request {index} messages do not contain {t!r}" for t in texts if t not in body]


def _check_error(wanted: Any, error: Optional[str]) -> List[str]:
    if wanted is False and error is not None:
        return [f"the run ended with an error: {_excerpt(error)}"]
    if wanted is True and error is None:
        return ["the run ended without an error, expected one"]
    if isinstance(wanted, str) and (error is None or wanted not in error):
        return [f"the error {_excerpt(error) if error else '(none)'} does not contain {wanted!r}"]
    return []


# --------------------------------------------------------------------------- reporting



def _excerpt(text: str, limit: int = 120) -> str:
    return _short(text, limit)


def _compact(names: Sequence[str]) -> str:
    """``round token×12 tool_start ...``: consecutive repeats folded."""  # noqa: RUF002 - the sign the transcript prints
    out: List[Tuple[str, int]] = []
    for name in names:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + 1)
        else:
            out.append((name, 1))
    return " ".join(f"{n}x{c}" if c > 1 else n for n, c in out)


def _transcript(events: Sequence[Event]) -> str:
    lines, text = [], []
    for event in events:
        if isinstance(event, TokenEvent):
            text.append(event.text)
            continue
        if text:
            lines.append("token " + json.dumps("".join(text), ensure_ascii=False))
            text = []
        if isinstance(event, ToolStartEvent):
            lines.append(f"tool_start {event.call.name} {event.call.arguments}")
        elif isinstance(event, ToolResultEvent):
            r = event.result
            lines.append(f"tool_result {r.name} ok={r.ok} {json.dumps(r.text if r.ok else r.error)}")
        elif isinstance(event, DoneEvent):
            lines.append("done " + json.dumps(dataclasses.asdict(event.result.telemetry)))
        else:
            lines.append(f"{event.name} {json.dumps(dict(vars(event)), default=str)}")
    if text:
        lines.append("token " + json.dumps("".join(text), ensure_ascii=False))
    return "\n".join(lines)




def expand_paths(paths: Iterable[str]) -> List[str]:
    """Files as given; a directory stands for the ``*.json`` files in it, sorted."""
    out: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            out.extend(os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".json"))
        else:
            out.append(path)
    return out


def run_files(paths: Sequence[str], report: Callable[[ScenarioResult], None],
              extra_tools: Sequence[Tool] = ()) -> List[ScenarioResult]:
    """Load and run each file; an invalid file is a failed (errored) scenario, not a crash.

    ``extra_tools`` (the command line's ``--mcp`` servers' tools) are offered beside each file's own.
    """
    results = []
    for path in paths:
        started = time.monotonic()
        try:
            scenario = load_scenario(path)
            if extra_tools:
                scenario = dataclasses.replace(scenario, imported=tuple(scenario.imported) + tuple(extra_tools))
        except ScenarioError as exc:
            name = os.path.splitext(os.path.basename(path))[0]
            result = ScenarioResult(name, path, time.monotonic() - started, error=f"invalid scenario: {exc}")
        else:
            result = run_scenario(scenario)
        report(result)
        results.append(result)
    return results
