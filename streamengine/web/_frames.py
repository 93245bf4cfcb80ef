"""Engine events -> Server-Sent Events bytes, following the WHATWG event-stream rules.

Why it is built this way:

* **Nothing the model or a tool wrote can become a field line.**  The ``event:``
  line comes from a fixed allowlist (:data:`EVENT_NAMES`), never from the event,
  and the only ``id:`` line is a run log's own ``<run id>.<seq>``
  (``web._runs.frame_bytes``).  Every payload is JSON with
  ``ensure_ascii=True``, so CR, LF, NUL, U+2028/U+2029 and lone surrogates all
  leave as ``\\uXXXX`` escapes: a frame is pure ASCII, each ``data:`` value sits
  on one line, and a model that writes ``"\\n\\nevent: tool_result\\n..."``
  reaches a browser as exactly one token event with identical text.
* **Tokens are the hot path** (tens of thousands per second), so a token frame
  is one C-level JSON string escape plus two concatenations.  Tokens carry no
  ``event:`` line: they are the default ``message`` event of ``EventSource``.
* **Pure**: no threads, no sockets, no clocks.  Heartbeats are produced by the
  engine (``run(heartbeat_s=...)`` yields ``HeartbeatEvent``); this module only
  renders them as the comment ``: ping``.
* **Duck-typed**: events are recognised by their ``name`` ClassVar and read
  with ``getattr``, so this module depends only on the standard library and
  the engine's event types (layering: ``_frames`` sits below the engine's
  runs it renders, beside ``_sse``).

Frames::

    : ok                                             OK_FRAME (first, from encode_stream)
    data: "<token text>"                             token
    event: tool_start   data: {"id","name","arguments"}
    event: tool_result  data: {"call_id","name","ok","text","error","duration_s","skipped"}
                        (skipped: why the call never ran, e.g. "duplicate"; null when it ran)
    event: round        data: {"round": n}
    event: reasoning    data: {"text": "...", "round": n}   (what a thinking model thinks; not the answer)
    event: refusal      data: {"text": "...", "round": n}   (the model refused; not the answer)
    event: reset        data: {"round": n, "reason": "..."}   (clear round n's text)
    event: error        data: {"message": "...", "request_id": "..."}   (request_id with PublicErrors)
    event: done         data: {"answer", "refusal", "reasoning", "telemetry", "usage"}
    : ping                                           heartbeat
    data: [DONE]                                     DONE_FRAME (always last)
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import abc
from itertools import repeat
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple, cast

from .._engine.events import Event

#: The response headers of the app's own event stream (proxies must not buffer it).
SSE_HEADERS: List[Tuple[str, str]] = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
]

#: Always the last frame of a stream; OpenAI-style clients stop on it.
DONE_FRAME = b"data: [DONE]\n\n"
#: First frame: flushes headers through proxies and tells the client the stream is live.
OK_FRAME = b": ok\n\n"
#: A comment: keeps proxies and browsers from timing the stream out, dispatches nothing.
PING_FRAME = b": ping\n\n"


# ensure_ascii: every control, line-separator and non-ASCII character leaves as a
# \uXXXX escape, so a payload is one ASCII line whatever the model wrote.
# allow_nan=False: NaN/Infinity are not JSON (_jsonable maps them to null first).
# check_circular=False: _jsonable's copy is a tree (depth-capped), never a cycle.
_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False, check_circular=False).encode

_MAX_DEPTH = 32


def encode_token(text: str) -> bytes:
    """``data: "<text as a JSON string>"\\n\\n`` — the hot path, kept to one escape call.

    ``encode_basestring_ascii`` is exactly what ``json.dumps(text)`` runs for a
    ``str`` with default settings, minus three Python-level calls per token.
    """
    try:
        return ("data: " + _json_string(text) + "\n\n").encode("ascii")
    except TypeError as exc:
        raise TypeError(
            f"a token event's text must be a str, got {type(text).__name__}; "
            "the engine should only emit TokenEvent(text=str)"
        ) from exc


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy: dataclasses as dicts (like ``dataclasses.asdict``), NaN/inf as null.

    Written out rather than ``asdict`` because ``asdict`` deep-copies leaves
    (it fails on locks, sockets, ...) and JSON's ``NaN``/``Infinity`` are not
    JSON: a browser's ``JSON.parse`` rejects the whole frame.  Anything else
    unknown becomes ``str(value)`` so one odd telemetry field cannot kill the
    terminal frame of a stream.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= _MAX_DEPTH:
        return str(value)
    # Below, a str, int, bool or None is taken as is without a call (most telemetry fields are).
    depth += 1
    names = _field_names(value)
    if names is not None:
        return {name: v if v.__class__ in _AS_IS else _jsonable(v, depth)
                for name, v in zip(names, map(getattr, repeat(value), names, repeat(None)))}
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, depth)
    if isinstance(value, abc.Mapping):  # collections.abc's: typing.Mapping's isinstance is many times slower
        return {str(k): v if v.__class__ in _AS_IS else _jsonable(v, depth) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [v if v.__class__ in _AS_IS else _jsonable(v, depth) for v in value]
    return str(value)


_AS_IS = frozenset({str, int, bool, type(None)})


#: Per type, its instances' dataclass field names (``dataclasses.fields`` builds a tuple each call),
#: or None: not a dataclass.
_FIELD_NAMES: Dict[type, Optional[Tuple[str, ...]]] = {}
_UNKNOWN = ("",)


def _field_names(value: Any) -> Optional[Tuple[str, ...]]:
    """The field names of a dataclass instance (as ``dataclasses.fields`` gives them); None for anything else."""
    kind = value.__class__
    names = _FIELD_NAMES.get(kind, _UNKNOWN)
    if names is _UNKNOWN:
        names = None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = tuple(f.name for f in dataclasses.fields(value))
        if len(_FIELD_NAMES) < 256:  # types are few (code defines them); never grown by data
            _FIELD_NAMES[kind] = names
    return names


def named_frame(prefix: bytes, payload: Dict[str, Any]) -> bytes:
    return prefix + _dumps(_jsonable(payload)).encode("ascii") + b"\n\n"


def data_frame(payload: Dict[str, Any]) -> bytes:
    """``data: {json}`` with no event line: the frame of the protocols whose type is inside the JSON (AI SDK, AG-UI)."""
    return named_frame(b"data: ", payload)


def _token(event: object) -> bytes:
    # A non-str text is refused by encode_token with a TypeError naming the mistake.
    return encode_token(cast(str, getattr(event, "text", None)))


def _tool_start(event: object) -> bytes:
    call = getattr(event, "call", None)
    return named_frame(b"event: tool_start\ndata: ", {
        "id": getattr(call, "id", None),
        "name": getattr(call, "name", None),
        "arguments": getattr(call, "arguments", None),
    })


def _tool_result(event: object) -> bytes:
    result = getattr(event, "result", None)
    return tool_result_frame(result, getattr(result, "error", None), getattr(event, "skipped", None))


def tool_result_frame(result: object, error: object, skipped: object = None) -> bytes:
    """The ``tool_result`` frame of ``result`` with ``error`` as the text its error is shown as.

    ``skipped`` (the event's) is sent as it is, whatever ``error`` became: a page tells a
    skipped call from a failed one by it, not by error text a redaction replaced.
    """
    return named_frame(b"event: tool_result\ndata: ", {
        "call_id": getattr(result, "call_id", None),
        "name": getattr(result, "name", None),
        "ok": getattr(result, "ok", None),
        "text": getattr(result, "text", None),
        "error": error,
        "duration_s": getattr(result, "duration_s", None),
        "skipped": skipped,
    })


def _round(event: object) -> bytes:
    return named_frame(b"event: round\ndata: ", {"round": getattr(event, "round", None)})


def _refusal(event: object) -> bytes:
    """The model refused: its words, apart from the answer's tokens."""
    return named_frame(b"event: refusal\ndata: ", {"text": getattr(event, "text", None),
                                                     "round": getattr(event, "round", None)})


def _reasoning(event: object) -> bytes:
    """What a thinking model thinks, as it streams: apart from the answer's tokens."""
    return named_frame(b"event: reasoning\ndata: ", {"text": getattr(event, "text", None),
                                                       "round": getattr(event, "round", None)})


def _reset(event: object) -> bytes:
    """The engine takes back a round's visible text (it will be written again); clients clear it."""
    return named_frame(b"event: reset\ndata: ", {"round": getattr(event, "round", None),
                                                   "reason": getattr(event, "reason", None)})


def _error(event: object) -> bytes:
    return named_frame(b"event: error\ndata: ", {"message": getattr(event, "message", None),
                                                   "fatal": getattr(event, "fatal", True)})


def _done(event: object) -> bytes:
    result = getattr(event, "result", None)
    return done_frame(result, getattr(result, "answer", None))


def done_frame(result: object, answer: object, telemetry: object = None) -> bytes:
    """The ``done`` frame of ``result`` with ``answer`` as the answer shown (and ``telemetry``, when given)."""
    return named_frame(b"event: done\ndata: ", {
        "answer": answer,
        "refusal": getattr(result, "refusal", None),
        "reasoning": getattr(result, "reasoning", None),
        "telemetry": telemetry if telemetry is not None else getattr(result, "telemetry", None),
        "usage": getattr(result, "usage", None),
    })


def _heartbeat(event: object) -> bytes:
    return PING_FRAME


# The allowlist: the only event names that can ever appear on an ``event:`` line
# are the literal prefixes above, chosen by this table's keys.
_ENCODERS: Dict[str, Callable[[object], bytes]] = {
    "token": _token,
    "tool_start": _tool_start,
    "tool_result": _tool_result,
    "round": _round,
    "refusal": _refusal,
    "reasoning": _reasoning,
    "reset": _reset,
    "error": _error,
    "done": _done,
    "heartbeat": _heartbeat,
}

#: Engine event names this module renders; any other name is refused.
EVENT_NAMES: FrozenSet[str] = frozenset(_ENCODERS)


def encode_event(event: Event) -> bytes:
    """One SSE frame (ending in a blank line) for one engine event.

    Raises ``ValueError`` for an event whose ``name`` is not in
    :data:`EVENT_NAMES`: an unknown event is a bug upstream, and guessing a
    rendering for it could put uncontrolled text on a field line.
    """
    name = getattr(event, "name", None)
    if name == "token":  # skip the table lookup on the hot path
        return _token(event)
    encoder = _ENCODERS.get(name) if isinstance(name, str) else None
    if encoder is None:
        raise ValueError(
            f"cannot encode {type(event).__name__} as SSE: its name {name!r} is not one of "
            f"{sorted(EVENT_NAMES)}; emit an engine event from streamengine._engine.events"
        )
    return encoder(event)
