"""The AI SDK's UI message stream (``useChat``, ``ai`` 5 to 7): its request, and engine events as its chunks.

Why it is built this way:

* **One state machine beside the SSE framer.**  :class:`UiMessageStream` is
  a :class:`~._sse.Framer`: batching, heartbeats, the disconnect probe and
  stuck readers stay :func:`~._sse.frames`' and :class:`~._sse.SseResponse`'s;
  this module only says which ``data: {json}`` chunks an event becomes.
* **Only what the client's version accepts.**  ``ai`` 5.0.0 and 6.0 up to
  about 6.0.230 validate every chunk with a strict schema (an unknown key
  fails the stream) and every version fails on an unknown chunk type, so
  version 5 (the default) writes only the chunk types and keys ``ai`` 5.0.0
  knows (no ``finishReason`` on ``finish``: it rides in ``messageMetadata``);
  6 adds ``finishReason``, ``tool-input-error``, 7 ``reset-step``.
* **Events are read by name**, and one this module has no chunk for is
  skipped (an unknown chunk type would kill the client's stream).  An
  ``approval_request`` (a run log's, ``approvals=True``) maps, from version
  6, to the call's card plus ``tool-approval-request {approvalId,
  toolCallId}``, then ``finish-step`` and ``finish``: the stream parks there,
  and the next request's ``approval-responded`` tool part
  (:func:`approval_responses`) answers it.
* **Over a run log, encoded on read.**  :class:`UiLogRender` turns the log's
  frames (the app's own events, their texts already public) back into
  events and through the same state machine, for the response that started
  the run and for any resume.
* **Every stream ends with ``finish`` or ``error``.**  A stream that just
  stops reads as success in ``useChat``, so a run that raised, or stopped
  without its ``done``, still ends with an ``error`` chunk; ``data: [DONE]``
  is always last.
* **A token is one short concatenation**: the open text part's prefix, the
  JSON string, the closing brace (no dict, no ``json.dumps`` call).
* **The request is untrusted.**  Only user text and assistant text reach the
  model; tool parts, reasoning and ``data-*`` parts a client sends are
  dropped, since the server's runs make those (:func:`chat_messages`).
"""
from __future__ import annotations

from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, Callable, ClassVar, Dict, Iterable, List, NamedTuple, Optional

from .._errors import ConfigError
from .._messages import Message, ToolCall
from .._parts import attachment_part
from .._validation import json_type
from ._frames import DONE_FRAME, OK_FRAME, data_frame
from ._guard import Headers, RequestRejected, clip, messages_from_request
from ._parts import PartsPolicy
from ._producer import LoggedErrors, LogRender
from ._sse import EventFramer, PublicErrors, held_call, result_call

#: The ``ai`` major versions whose UI message stream the app can speak (``make_wsgi_app(ai_sdk_version=)``).
AI_SDK_VERSIONS = (5, 6, 7)
#: The response headers ``DefaultChatTransport`` expects (no-transform: a proxy must not compress or buffer).
UI_STREAM_HEADERS: Headers = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("x-vercel-ai-ui-message-stream", "v1"),
    ("Cache-Control", "no-cache, no-transform"),
    ("X-Accel-Buffering", "no"),
]
#: ``providerMetadata`` of the text part a refusal is written in.
REFUSAL_METADATA = {"streamengine": {"refusal": True}}

_SEND = 'send useChat\'s body {"id": "...", "messages": [{"id": "...", "role": "user", "parts": [...]}]}'
_TRIGGERS = ("submit-message", "regenerate-message")
#: Part types a client may send that are the server's to make: dropped, never forwarded.
_DROPPED_PART = ("reasoning", "step-start", "source-url", "source-document", "dynamic-tool")


def check_ai_sdk_version(version: object) -> int:
    """``version`` is one of :data:`AI_SDK_VERSIONS` (whether it can ask about held calls is ``_app``'s warning)."""
    if isinstance(version, bool) or version not in AI_SDK_VERSIONS:
        raise ConfigError(f"ai_sdk_version must be one of {', '.join(map(str, AI_SDK_VERSIONS))} (the major "
                          f"version of the 'ai' package your frontend uses), got {version!r}")
    assert isinstance(version, int)
    return version


# --- the request -------------------------------------------------------------------------------

def chat_messages(payload: Any, *, system_prompt: Optional[str] = None,
                  parts: Optional[PartsPolicy] = None) -> List[Message]:
    """The conversation to run for ``useChat``'s request body, under the app's message policy.

    Each ``UIMessage`` becomes its text: a user's text parts, an assistant's
    text parts (its tool, reasoning and ``data-*`` parts are dropped: a client
    could forge them).  ``system`` messages are refused (the system prompt is
    the application's).  A user's file parts pass as the app's ``parts``
    policy allows (none by default: a 400 that names the option).  The last
    message must be the user's.
    """
    if not isinstance(payload, dict):
        raise RequestRejected(f"body must be a JSON object, got {json_type(payload)}; {_SEND}", "body")
    trigger = payload.get("trigger", "submit-message")
    if trigger not in _TRIGGERS:
        raise RequestRejected(f"trigger must be one of {', '.join(_TRIGGERS)}, got {trigger!r}; {_SEND}",
                              "trigger")
    raw = payload.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestRejected(f"\"messages\" must be a non-empty list of UIMessages, got {json_type(raw)}; "
                              f"{_SEND}", "messages")
    simple = [_as_text_message(i, message) for i, message in enumerate(raw)]
    messages = messages_from_request({"messages": simple}, system_prompt=system_prompt, parts=parts)
    return [m for m in messages if m.role != "assistant" or m.content]


def chat_id(payload: Any) -> str:
    """The chat's id (``useChat``'s ``id``): what its resume asks by; printable, at most 200 characters."""
    value = payload.get("id") if isinstance(payload, dict) else None
    if not isinstance(value, str) or not value or len(value) > 200 or not value.isprintable() or "/" in value:
        raise RequestRejected(f"\"id\" must be the chat's id (1-200 printable characters, no '/'), got "
                              f"{clip(repr(value), 60)}; {_SEND}", "id")
    return value


class ApprovalResponse(NamedTuple):
    """An ``approval-responded`` tool part of the request's last (assistant) message: the user's answer."""

    call_id: str
    approved: bool
    reason: str


def approval_responses(payload: Any) -> List[ApprovalResponse]:
    """The answers the request carries: the last message's tool parts in state ``approval-responded``.

    Only when the last message is the assistant's (``addToolApprovalResponse``
    then a request on that message); the caller accepts each only for a call
    its run holds.  A part whose approval is not ``{id, approved, reason?}``
    with the id of its call is no answer.
    """
    messages = payload.get("messages") if isinstance(payload, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant" or not isinstance(last.get("parts"), list):
        return []
    answers: List[ApprovalResponse] = []
    for part in last["parts"]:
        if not isinstance(part, dict) or part.get("state") != "approval-responded":
            continue
        approval, call_id = part.get("approval"), part.get("toolCallId")
        if not isinstance(approval, dict) or approval.get("id") != call_id or not isinstance(call_id, str) \
                or not isinstance(approval.get("approved"), bool):
            continue
        reason = approval.get("reason")
        answers.append(ApprovalResponse(call_id, approval["approved"], reason if isinstance(reason, str) else ""))
    return answers


def _as_text_message(i: int, message: Any) -> Dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestRejected(f"{where} must be a UIMessage object, got {json_type(message)}; {_SEND}", where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        shown = repr(role) if isinstance(role, str) else json_type(role)
        raise RequestRejected(f"{where}.role {shown} is not accepted from a request; send \"user\" or "
                              "\"assistant\" (the system prompt is the application's: "
                              "make_wsgi_app(engine, system_prompt=...))", f"{where}.role")
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise RequestRejected(f"{where}.parts must be a list of parts, got {json_type(parts)}; {_SEND}",
                              f"{where}.parts")
    texts: List[str] = []
    media: List[Dict[str, Any]] = []
    for j, part in enumerate(parts):
        if role == "user" and isinstance(part, dict) and part.get("type") == "file":
            media.append(_file_part(f"{where}.parts[{j}]", part))
            continue
        text = _part_text(f"{where}.parts[{j}]", part, role)
        if text is not None:
            texts.append(text)
    text = "\n".join(texts)
    if not media:
        return {"role": role, "content": text}
    return {"role": role, "content": ([{"type": "text", "text": text}] if text else []) + media}


def _file_part(where: str, part: Dict[str, Any]) -> Dict[str, Any]:
    """A user's file part as an OpenAI content part; the parts policy judges it with the others."""
    media_type, url, filename = part.get("mediaType"), part.get("url"), part.get("filename")
    if not isinstance(media_type, str) or not isinstance(url, str) or not isinstance(filename, (str, type(None))):
        raise RequestRejected(f"{where} must be a file part with a string \"mediaType\" and \"url\" (a data: URL); "
                              f"{_SEND}", where)
    try:
        return attachment_part(media_type, url, filename)
    except ConfigError as exc:
        raise RequestRejected(f"{where}: {exc}", where) from exc


def _part_text(where: str, part: Any, role: str) -> Optional[str]:
    """A part's text, or None for a part that is dropped."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise RequestRejected(f"{where} must be a part object with a \"type\", got {json_type(part)}", where)
    kind = part["type"]
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestRejected(f"{where}.text must be a string, got {json_type(text)}", f"{where}.text")
        return text
    if kind in _DROPPED_PART or kind.startswith(("tool-", "data-")) or kind == "file":
        return None
    raise RequestRejected(f"{where}.type {clip(kind, 60)!r} is not a UIMessage part this server knows; send "
                          "text parts", f"{where}.type")


# --- the stream ------------------------------------------------------------------------------------

class UiMessageStream(EventFramer):
    """One response's UI message stream: engine events in, ``data: {json}`` chunks out (a ``Framer``).

    Parts follow the run: a ``start-step`` per round, a text part per stretch
    of tokens (closed before a tool card, so later text lands after it), a
    reasoning part per stretch of reasoning, one tool part per call, the
    refusal as a text part of its own marked in ``providerMetadata``.
    Extras ride in ``data-streamengine-*`` parts and ``messageMetadata``.
    """

    def __init__(self, errors: PublicErrors, message_id: str, version: int = 5, held: Iterable[str] = ()) -> None:
        super().__init__(errors)
        self.version = check_ai_sdk_version(version)
        #: The stream ended at a held call's approval request (the answer comes in the next request).
        self.parked = False
        self._message_id = message_id
        self._count = 0
        self._step = False
        self._text: Optional[str] = None
        self._delta_prefix = ""
        self._reasoning: Optional[str] = None
        self._refused = False
        self._shown: Dict[str, List[bytes]] = {}  # the round's tool parts (call id -> chunks), for reset-step
        # Calls whose approval was asked (in this stream, or in the one ``held`` continues): a refusal of one is
        # its card's output-denied, and a card the client has is not shown again.
        self._asked = set(held)

    # --- Framer -----------------------------------------------------------------------------
    def opening(self) -> bytes:
        return OK_FRAME + data_frame({"type": "start", "messageId": self._message_id})

    def _text_delta(self, text: str) -> bytes:
        head = self._open_text() if self._text is None else b""
        return head + (self._delta_prefix + _json_string(text) + "}\n\n").encode("ascii")

    def failure(self, exc: BaseException) -> bytes:
        return self.failure_text_frame(self._errors.failure_text(exc))  # logged even after the stream ended

    def failure_text_frame(self, text: str) -> bytes:
        """An ``error`` chunk with ``text`` (already public) that ends the stream."""
        if self._ended:
            return b""
        self._ended = True
        return data_frame({"type": "error", "errorText": text})

    def closing(self) -> bytes:
        if self._ended:
            return DONE_FRAME
        self._ended = True
        text = self._errors.public("the answer ended without finishing", "the run stopped before its done event")
        return data_frame({"type": "error", "errorText": text}) + DONE_FRAME

    # --- parts ---------------------------------------------------------------------------------
    def _new_id(self, kind: str) -> str:
        self._count += 1
        return f"{kind}-{self._count}"

    def _start_step(self) -> bytes:
        self._step = True
        self._shown = {}
        return data_frame({"type": "start-step"})

    def _open_text(self) -> bytes:
        head = self._close_reasoning() + (b"" if self._step else self._start_step())
        self._text = self._new_id("text")
        self._delta_prefix = f'data: {{"type":"text-delta","id":"{self._text}","delta":'
        return head + data_frame({"type": "text-start", "id": self._text})

    def _close_text(self) -> bytes:
        self._prose.reset()
        if self._text is None:
            return b""
        text, self._text = self._text, None
        return data_frame({"type": "text-end", "id": text})

    def _close_reasoning(self) -> bytes:
        if self._reasoning is None:
            return b""
        part, self._reasoning = self._reasoning, None
        return data_frame({"type": "reasoning-end", "id": part})

    def _close_parts(self) -> bytes:
        return self._close_text() + self._close_reasoning()

    def _finish_step(self) -> bytes:
        closed = self._close_parts()
        if not self._step:
            return closed
        self._step = False
        return closed + data_frame({"type": "finish-step"})

    # --- events ------------------------------------------------------------------------------------
    def _round(self, event: object) -> bytes:
        return self._finish_step() + self._start_step()

    def _reasoning_event(self, event: object) -> bytes:
        text = getattr(event, "text", "")
        if not isinstance(text, str) or not text:
            return b""
        head = b""
        if self._reasoning is None:
            head = self._close_text() + (b"" if self._step else self._start_step())
            self._reasoning = self._new_id("reasoning")
            head += data_frame({"type": "reasoning-start", "id": self._reasoning})
        return head + data_frame({"type": "reasoning-delta", "id": self._reasoning, "delta": text})

    def _tool_start(self, event: object) -> bytes:
        call = getattr(event, "call", None)
        if not isinstance(call, ToolCall) or call.id in self._asked:  # an approved call's card is shown already
            return b""
        return self._show_input(call)

    def _show_input(self, call: ToolCall, invalid: Optional[str] = None) -> bytes:
        """The call's card: ``tool-input-start`` and its input (an input error from v6 for unreadable input)."""
        head = self._close_parts() + (b"" if self._step else self._start_step())
        chunks = [data_frame({"type": "tool-input-start", "toolCallId": call.id, "toolName": call.name})]
        try:
            value: Any = call.args()
        except Exception:  # unreadable arguments: their raw text is the input shown
            value, invalid = call.arguments, invalid or "the arguments are not a JSON object"
        if invalid is not None and self.version >= 6:
            chunks.append(data_frame({"type": "tool-input-error", "toolCallId": call.id, "toolName": call.name,
                                      "input": value, "errorText": invalid}))
        else:
            chunks.append(data_frame({"type": "tool-input-available", "toolCallId": call.id,
                                      "toolName": call.name, "input": value}))
        self._shown[call.id] = chunks
        return head + b"".join(chunks)

    def _tool_result(self, event: object) -> bytes:
        result = getattr(event, "result", None)
        call_id = getattr(result, "call_id", None)
        if not isinstance(call_id, str):
            return b""
        skipped = getattr(event, "skipped", None)
        error = self._errors.tool_error_text(result, skipped)
        head = b""
        if call_id not in self._shown and call_id not in self._asked:  # never started (skipped): shown as asked
            call = result_call(event, result, call_id)
            invalid = str(error) if skipped == "invalid" else None
            head = self._show_input(call, invalid)
            if invalid is not None and self.version >= 6:  # the input error is the card's final state
                return head + self._tool_extras(call_id, result, skipped)
        if getattr(result, "ok", False):
            chunk: Dict[str, Any] = {"type": "tool-output-available", "toolCallId": call_id,
                                     "output": getattr(result, "text", "")}
        elif skipped == "not_approved" and call_id in self._asked:  # the card's approval-responded: denied
            chunk = {"type": "tool-output-denied", "toolCallId": call_id}
        else:
            chunk = {"type": "tool-output-error", "toolCallId": call_id, "errorText": str(error or "failed")}
        frame = data_frame(chunk)
        self._shown.setdefault(call_id, []).append(frame)
        return head + frame + self._tool_extras(call_id, result, skipped)

    @staticmethod
    def _tool_extras(call_id: str, result: object, skipped: object) -> bytes:
        return data_frame({"type": "data-streamengine-tool", "id": f"tool-{call_id}", "data": {
            "toolCallId": call_id, "durationS": getattr(result, "duration_s", None), "skipped": skipped,
            "timedOut": getattr(result, "timed_out", False)}})

    def _refusal(self, event: object) -> bytes:
        text = getattr(event, "text", "")
        head = self._close_parts() + (b"" if self._step else self._start_step())
        part = self._new_id("refusal")
        self._refused = True
        return head + b"".join([
            data_frame({"type": "text-start", "id": part, "providerMetadata": REFUSAL_METADATA}),
            data_frame({"type": "text-delta", "id": part, "delta": text if isinstance(text, str) else ""}),
            data_frame({"type": "text-end", "id": part, "providerMetadata": REFUSAL_METADATA}),
        ])

    def _error(self, event: object) -> bytes:
        message = self._errors.error_text(event)
        if getattr(event, "fatal", True):
            self._ended = True  # useChat's run ends at an error chunk: nothing after it is read
            return data_frame({"type": "error", "errorText": message})
        return data_frame({"type": "data-streamengine-error", "data": {
            "message": message, "requestId": self._errors.request_id}})

    def _reset(self, event: object) -> bytes:
        """Round ``n``'s text is taken back: v7 removes the step's parts, earlier versions are told in a data part."""
        payload = {"round": getattr(event, "round", None), "reason": getattr(event, "reason", None)}
        if self.version >= 7:
            self._text = self._reasoning = None  # reset-step drops the open parts with the rest of the step
            self._prose.reset()
            tools = [chunk for chunks in self._shown.values() for chunk in chunks]  # they survive: shown again
            return b"".join([data_frame({"type": "reset-step"}), *tools,
                             data_frame({"type": "data-streamengine-reset", "data": payload})])
        return self._close_parts() + data_frame({"type": "data-streamengine-reset", "data": payload})

    def _approval_request(self, event: object) -> bytes:
        """A held call (ai 6 and 7): its card, ``tool-approval-request``, and the message's ``finish``.

        The stream ends here (:attr:`parked`); the run waits in its log, and
        the client's next request carries the answer (``approval-responded``)
        and gets the rest on the same message.  The approval's id is the
        call's: the server checks it against the calls its run holds.
        """
        call = held_call(event)
        if self.version < 6 or call is None:
            return b""
        head = b"" if call.id in self._shown or call.id in self._asked else self._show_input(call)
        self._asked.add(call.id)
        self._ended = self.parked = True
        finish: Dict[str, Any] = {"type": "finish", "finishReason": "tool-calls",
                                  "messageMetadata": {"finishReason": "tool-calls"}}
        return head + data_frame({"type": "tool-approval-request", "approvalId": call.id, "toolCallId": call.id}) \
            + self._finish_step() + data_frame(finish)

    def _done(self, event: object) -> bytes:
        result = getattr(event, "result", None)
        self._ended = True
        reason = self._finish_reason(result)
        finish: Dict[str, Any] = {"type": "finish", "messageMetadata": {
            "finishReason": reason, "usage": getattr(result, "usage", None),
            "telemetry": self._errors.telemetry(getattr(result, "telemetry", None))}}
        if self.version >= 6:  # ai 5.0's strict schema has no finishReason on finish
            finish["finishReason"] = reason
        return self._finish_step() + data_frame(finish)

    def _finish_reason(self, result: object) -> str:
        cut_off = getattr(result, "cut_off", None)
        if self._refused or cut_off == "content_filter":
            return "content-filter"
        return "length" if cut_off == "length" else "stop"

    _HANDLERS: ClassVar[Dict[str, Callable[[UiMessageStream, object], bytes]]] = {
        "round": _round, "reasoning": _reasoning_event, "tool_start": _tool_start, "tool_result": _tool_result,
        "refusal": _refusal, "error": _error, "reset": _reset, "done": _done,
        "approval_request": _approval_request,
    }



class UiLogRender(LogRender):
    """A run's log frames as one UI message stream, on the message id the run was started with."""

    def __init__(self, message_id: str, version: int, request_id: str, held: Iterable[str] = (),
                 settled: Iterable[str] = ()) -> None:
        """``held``: calls whose approval card the client has; ``settled``: answered calls a replay passes by."""
        self._stream: UiMessageStream = UiMessageStream(LoggedErrors(request_id), message_id, version, held)
        self._settled = frozenset(settled)

    def done(self) -> bytes:
        return DONE_FRAME

    def _passed_by(self, event: object) -> bool:
        """An approval request of a call already answered: a replay shows the card's outcome, not the question."""
        call = getattr(event, "call", None)
        return getattr(event, "name", None) == "approval_request" and isinstance(call, dict) \
            and call.get("id") in self._settled

    def error(self, code: str, message: str) -> bytes:
        return self._stream.failure_text_frame(message)
