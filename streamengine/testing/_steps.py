"""Steps for FakeProvider turns: what the fake server writes, waits for, or breaks.

``from streamengine.testing import steps as s`` then ``s.text("Hel")``, ``s.delay(0.05)``...
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .._messages import StopReason

__all__ = ['Stamp', 'Step', 'comment', 'delay', 'done', 'drop', 'empty_delta', 'end', 'error_frame', 'finish',
           'forever', 'http_error', 'ping_event', 'raw', 'reasoning', 'redacted_reasoning', 'reply', 'signal',
           'stall', 'stall_before_headers', 'text', 'tool_call', 'trickle', 'usage', 'wait']

_POLL_S = 0.02
_TIMING = frozenset({"delay", "wait", "signal"})
_PRE_HEADER = frozenset({"http_error", "stall_before_headers", "drop"})
_TERMINAL = frozenset({"done", "end", "stall", "drop", "http_error", "stall_before_headers", "forever"})
_FRAMES = frozenset({"delta", "finish", "usage", "done", "sse", "raw", "error_frame", "redacted"})
_DROP_PHANTOM_BYTES = 1024  # declared but never sent, so a drop is visible on Content-Length bodies
_FOREVER_PHANTOM_BYTES = 1 << 40  # a Content-Length that "forever" never reaches


# -- steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One scripted action of a turn; build them with the functions in ``steps``."""

    kind: str
    value: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)


def text(s: str) -> Step:
    """A content delta."""
    return Step("delta", {"content": s})


#: The Chat Completions delta fields reasoning comes in: DeepSeek's and vLLM's, and OpenRouter's (and newer vLLM's).
REASONING_FIELDS = ("reasoning_content", "reasoning")


def reasoning(s: str, field: str = "reasoning_content") -> Step:
    """A reasoning delta: ``reasoning_content`` (DeepSeek, vLLM) or, with ``field="reasoning"``, ``reasoning``.

    The Anthropic wire sends it as a ``thinking`` block (signed at its stop), the
    Responses wire as a ``reasoning`` item's summary.
    """
    if field not in REASONING_FIELDS:
        raise ValueError(f"reasoning(field=...) must be one of {', '.join(REASONING_FIELDS)}, got {field!r}")
    return Step("delta", {field: s})


def redacted_reasoning(data: str) -> Step:
    """Reasoning the provider hides but needs back: an Anthropic ``redacted_thinking`` block with ``data``.

    On the Responses wire, a ``reasoning`` item with no summary and ``data`` as its
    ``encrypted_content``; Chat Completions has no such thing and sends nothing.
    """
    return Step("redacted", data)


def reasoning_of(delta: Mapping[str, Any]) -> str:
    """The reasoning text of a scripted delta, whichever field carries it."""
    return str(delta.get("reasoning_content") or delta.get("reasoning") or "")


def tool_call(index: int, id: Optional[str] = None, name: Optional[str] = None,
              arguments: Optional[str] = None) -> Step:
    """A native tool-call fragment; fields left ``None`` are not sent."""
    call: Dict[str, Any] = {"index": index}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    if function:
        call["function"] = function
    return Step("delta", {"tool_calls": [call]})


def empty_delta() -> Step:
    """A delta with nothing in it (OpenAI's first frame): not meaningful."""
    return Step("delta", {"role": "assistant", "content": ""})


def finish(reason: str = StopReason.STOP) -> Step:
    return Step("finish", reason)


def usage(prompt: int = 1, completion: int = 1) -> Step:
    """A usage-only frame (``choices: []``), as ``stream_options.include_usage`` sends."""
    return Step("usage", (prompt, completion))


def done() -> Step:
    """``data: [DONE]``."""
    return Step("done")


def delay(seconds: float) -> Step:
    """Pause; ends early if the provider closes or the client goes away."""
    return Step("delay", float(seconds))


def wait(event: threading.Event, timeout: float = 10.0) -> Step:
    """Hold the next frame until the test sets ``event`` (or ``timeout`` passes)."""
    return Step("wait", event, {"timeout": float(timeout)})


class Stamp(threading.Event):
    """An Event that remembers when it was first set (``time.monotonic()``).

    Hand it to :func:`signal` to learn when the server wrote a point of the
    stream, e.g. the end of a round, and compare with a tool's ``started_at``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.at: Optional[float] = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        super().set()


def signal(event: threading.Event) -> Step:
    """Set ``event`` when the server gets here (everything before it is written)."""
    return Step("signal", event)


def comment(text: str = "keep-alive") -> Step:
    """An SSE comment line (``: keep-alive``): reaches the socket, never the caller."""
    return Step("sse", f": {text}\n\n".encode())


def ping_event() -> Step:
    """An ``event: ping`` frame, as some providers send while the model thinks."""
    return Step("sse", b'event: ping\ndata: {"type": "ping"}\n\n')


def stall() -> Step:
    """Send nothing more until the client goes away or the provider closes."""
    return Step("stall")


def stall_before_headers() -> Step:
    """Stall before the status line: the client waits for response headers."""
    return Step("stall_before_headers")


def forever(*frames: Step, every: float = 0.05) -> Step:
    """Send ``frames`` every ``every`` seconds until the client goes away or the provider closes.

    For streams that never end but are never silent either: keep-alive
    comments (``forever(comment())``), ``event: ping`` frames, empty deltas
    -- or content (``forever(text("x"))``) to run into the absolute cap.
    Only frame steps are allowed inside.  Terminal, like ``stall``.
    """
    frames = tuple(_flatten(frames))
    if not frames or any(f.kind not in _FRAMES for f in frames):
        raise ValueError("forever() repeats frame steps (text, comment, ping_event, empty_delta, raw...)")
    if not every > 0:
        raise ValueError(f"forever(every=...) must be a positive number of seconds, got {every!r}")
    return Step("forever", frames, {"every": float(every)})


def trickle(data: Union[bytes, str], interval: float = 0.5) -> Step:
    """Write ``data`` one byte at a time, pausing ``interval`` seconds before each byte.

    A frame trickled this way completes only after ``len(data) * interval``
    seconds: bytes keep arriving (a socket read timeout never fires) while
    nothing meaningful does.  Ends early if the client goes away.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return Step("trickle", payload, {"interval": float(interval)})


def drop() -> Step:
    """Close the connection abruptly: no more bytes, no body terminator."""
    return Step("drop")


def end() -> Step:
    """End the body cleanly without a finish reason or ``[DONE]``."""
    return Step("end")


def http_error(status: int, body: Union[Mapping[str, Any], str, bytes, None] = None,
               headers: Optional[Mapping[str, str]] = None,
               content_type: str = "application/json") -> Step:
    """Answer with an HTTP error status (must come before any frame)."""
    return Step("http_error", status, {"body": body, "headers": dict(headers or {}),
                                       "content_type": content_type})


def raw(data: Union[bytes, str]) -> Step:
    """Bytes written verbatim (a str is UTF-8 encoded); the body of a non-stream answer."""
    return Step("raw", data.encode("utf-8") if isinstance(data, str) else bytes(data))


def error_frame(message: str, type: Optional[str] = None, code: Any = None) -> Step:
    """An in-band ``{"error": {...}}`` frame (a 200 ``{"error": ...}`` body when not streaming)."""
    error: Dict[str, Any] = {"message": message}
    if type is not None:
        error["type"] = type
    if code is not None:
        error["code"] = code
    return Step("error_frame", {"error": error})


def reply(s: str, pieces: int = 1) -> List[Step]:
    """``s`` split into ``pieces`` text steps of near-equal length."""
    pieces = max(1, min(pieces, len(s) or 1))
    size = math.ceil(len(s) / pieces) if s else 0
    return [text(s[i:i + size]) for i in range(0, len(s), size)] if s else [text("")]


def continues_call(open_call: Optional[Sequence[Any]], kind: str, call: Mapping[str, Any]) -> bool:
    """Whether a ``tool_call`` fragment belongs to the call a wire encoder has open.

    ``open_call`` is the encoder's ``(kind, OpenAI index, id)`` of its open
    block or item; a fragment continues it on the same index without a new id.
    The Anthropic and Responses wires both start a new block or item otherwise.
    """
    return (open_call is not None and open_call[0] == kind and open_call[1] == call["index"]
            and call.get("id") in (None, open_call[2]))


#: What a turn is made of: steps, and lists or tuples of them (such as :func:`reply`'s), nested as you like.
StepLike = Union[Step, Sequence["StepLike"]]


def _flatten(items: Sequence[StepLike]) -> List[Step]:
    out: List[Step] = []
    for item in items:
        if isinstance(item, Step):
            out.append(item)
        elif isinstance(item, (list, tuple)):
            out.extend(_flatten(item))
        else:
            raise TypeError(f"a turn is made of steps (streamengine.testing._steps.*), got {item!r}")
    return out
