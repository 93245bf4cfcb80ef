"""AG-UI (``@ag-ui/client``'s ``HttpAgent``, CopilotKit): its ``RunAgentInput``, and engine events as its events.

Why it is built this way:

* **Beside the SSE framer, like the AI SDK's stream** (:mod:`._aisdk`):
  :class:`AgUiStream` is a :class:`~._sse.Framer`, so batching, heartbeats
  and the disconnect checks are the app's own.
* **Exactly one terminal event** (``RUN_FINISHED`` or ``RUN_ERROR``), and
  nothing after it: the client's verifier rejects any event after either.
  No ``data: [DONE]`` either: the client would try to parse it as an event.
* **Messages are kept as the run goes**, text as lists of deltas joined
  once: a ``reset`` (failover after tokens) sends ``MESSAGES_SNAPSHOT``
  without the discarded text, so the client's message list is replaced by
  what survives.
* **The input is untrusted**: user and assistant text only; the client's
  tool, reasoning and activity messages, tools and context are dropped.
"""
from __future__ import annotations

from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, Callable, ClassVar, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from .._errors import ConfigError
from .._messages import Message, ToolCall
from .._parts import attachment_part, guessed_type
from .._validation import json_type
from ._frames import OK_FRAME, data_frame
from ._guard import Headers, RequestRejected, clip, messages_from_request
from ._parts import PartsPolicy
from ._producer import LoggedErrors, LogRender
from ._sse import EventFramer, PublicErrors, held_call, result_call

#: The response headers of an AG-UI stream.
AGUI_HEADERS: Headers = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache, no-transform"),
    ("X-Accel-Buffering", "no"),
]

_SEND = 'send a RunAgentInput {"threadId": "...", "runId": "...", "messages": [{"id": "...", "role": "user", ' \
        '"content": "..."}]}'
_MAX_ID_CHARS = 200
#: Roles a client may send that are the server's to make: dropped, never forwarded.
_DROPPED_ROLES = ("tool", "reasoning", "activity")


class RunInput(NamedTuple):
    """What the app takes from a ``RunAgentInput``: its ids (echoed), the client's messages and the run's."""

    thread_id: str
    run_id: str
    raw_messages: List[Any]
    messages: List[Message]


def run_input(payload: Any, *, system_prompt: Optional[str] = None, parts: Optional[PartsPolicy] = None) -> RunInput:
    """The run an AG-UI ``RunAgentInput`` asks for, under the app's message policy.

    ``threadId`` and ``runId`` are echoed in ``RUN_STARTED``/``RUN_FINISHED``;
    a user message's text (a string, or its text parts) and an assistant's
    ``content`` are kept; ``system``/``developer`` messages are refused (the
    system prompt is the application's); tool calls and tool, reasoning and
    activity messages are dropped.  A user's images, audio and documents pass
    as the app's ``parts`` policy allows (none by default).  The last kept message
    must be the user's.
    """
    if not isinstance(payload, dict):
        raise RequestRejected(f"body must be a JSON object, got {json_type(payload)}; {_SEND}", "body")
    thread_id, run_id = _identifier(payload, "threadId"), _identifier(payload, "runId")
    raw = payload.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestRejected(f"\"messages\" must be a non-empty list, got {json_type(raw)}; {_SEND}", "messages")
    kept = [m for m in (_as_text_message(i, message) for i, message in enumerate(raw)) if m is not None]
    if not kept:
        raise RequestRejected(f"\"messages\" holds no user or assistant message; {_SEND}", "messages")
    messages = messages_from_request({"messages": kept}, system_prompt=system_prompt, parts=parts)
    return RunInput(thread_id, run_id, raw, [m for m in messages if m.role != "assistant" or m.content])


def resume_entries(payload: Any) -> Optional[Tuple[RunInput, List[Tuple[str, bool, str]]]]:
    """A ``RunAgentInput`` that resumes interrupted calls: its ids and the answers ``(call_id, approved, reason)``.

    None when it carries no ``resume``.  An entry approves only when its
    status is ``resolved`` and its payload says ``{"approved": true}``; a
    ``cancelled`` one refuses.  The caller accepts each only for a call its
    run holds; the messages are not run (the held run goes on).
    """
    entries = payload.get("resume") if isinstance(payload, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    thread_id, run_id = _identifier(payload, "threadId"), _identifier(payload, "runId")
    answers: List[Tuple[str, bool, str]] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("interruptId"), str):
            continue
        answer = entry.get("payload")
        approved = entry.get("status") == "resolved" and isinstance(answer, dict) and answer.get("approved") is True
        reason = answer.get("reason") if isinstance(answer, dict) else None
        answers.append((entry["interruptId"], approved, reason if isinstance(reason, str) else ""))
    raw = payload.get("messages")
    return RunInput(thread_id, run_id, raw if isinstance(raw, list) else [], []), answers


def _identifier(payload: Dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value or len(value) > _MAX_ID_CHARS or not value.isprintable():
        raise RequestRejected(f"{key} must be a printable string of 1 to {_MAX_ID_CHARS} characters, got "
                              f"{json_type(value)}; {_SEND}", key)
    return value


def _as_text_message(i: int, message: Any) -> Optional[Dict[str, Any]]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestRejected(f"{where} must be a message object, got {json_type(message)}; {_SEND}", where)
    role = message.get("role")
    if role in _DROPPED_ROLES:
        return None
    if role not in ("user", "assistant"):
        shown = repr(role) if isinstance(role, str) else json_type(role)
        raise RequestRejected(f"{where}.role {shown} is not accepted from a request; send \"user\" or "
                              "\"assistant\" (the system prompt is the application's: "
                              "make_wsgi_app(engine, system_prompt=...))", f"{where}.role")
    content = message.get("content")
    if role == "assistant" and content is None:  # only tool calls: dropped with them
        return {"role": role, "content": ""}
    if isinstance(content, list) and role == "user":
        return {"role": role, "content": _user_content(where, content)}
    if isinstance(content, list):
        content = "\n".join(_part_text(f"{where}.content[{j}]", part) for j, part in enumerate(content))
    if not isinstance(content, str):
        raise RequestRejected(f"{where}.content must be a string or a list of text parts, got "
                              f"{json_type(content)}; {_SEND}", f"{where}.content")
    return {"role": role, "content": content}


def _user_content(where: str, content: List[Any]) -> Any:
    """A user's content list: its text, or OpenAI content parts when it holds images, audio or documents."""
    texts: List[str] = []
    media: List[Dict[str, Any]] = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in _MEDIA_PARTS:
            media.append(_media_part(f"{where}.content[{j}]", part))
        else:
            texts.append(_part_text(f"{where}.content[{j}]", part))
    text = "\n".join(texts)
    if not media:
        return text
    return ([{"type": "text", "text": text}] if text else []) + media


#: AG-UI 1.0's media parts (a ``source``), and the older ``binary`` content its client still accepts.
_MEDIA_PARTS = ("image", "audio", "document", "binary")


def _media_part(where: str, part: Dict[str, Any]) -> Dict[str, Any]:
    """An image, audio or document part (``source``: data or URL), or older ``binary`` content, as an
    OpenAI content part.  A ``file`` source or an ``id`` names a file in some provider account: never
    taken from a request, as the parts policy refuses a ``file_id``."""
    media_type, data, url, filename = _media_fields(part)
    if not isinstance(media_type, str) or not isinstance(filename, (str, type(None))) \
            or not (isinstance(data, str) or isinstance(url, str)):
        raise RequestRejected(f"{where} must carry a media type and its data (base64) or a URL: "
                              "{\"type\": \"image\", \"source\": {\"type\": \"data\", \"value\": \"...\", "
                              "\"mimeType\": \"image/png\"}}; a file id is not taken from a request", where)
    source = f"data:{media_type};base64,{data}" if isinstance(data, str) else str(url)
    try:
        return attachment_part(media_type, source, filename)
    except ConfigError as exc:
        raise RequestRejected(f"{where}: {exc}", where) from exc


def _media_fields(part: Dict[str, Any]) -> Tuple[Any, Any, Any, Any]:
    """``(media type, base64 data, url, filename)`` of a media part in either of AG-UI's forms."""
    if part.get("type") == "binary":
        return part.get("mimeType"), part.get("data"), part.get("url"), part.get("filename")
    source = part.get("source")
    metadata = part.get("metadata")
    filename = metadata.get("filename") if isinstance(metadata, dict) else None
    if not isinstance(source, dict) or source.get("type") not in ("data", "url"):
        return None, None, None, filename
    value = source.get("value")
    media_type = source.get("mimeType")
    if source["type"] == "url" and media_type is None and isinstance(value, str):
        media_type = guessed_type(value) or "application/octet-stream"
    return (media_type, value, None, filename) if source["type"] == "data" else (media_type, None, value, filename)


def _part_text(where: str, part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    kind = part.get("type") if isinstance(part, dict) else None
    shown = clip(kind, 60) if isinstance(kind, str) else json_type(part)
    raise RequestRejected(f"{where} is a {shown!r} part; this server takes text only: send "
                          "{\"type\": \"text\", \"text\": \"...\"}", where)


class AgUiStream(EventFramer):
    """One response's AG-UI events: engine events in, ``data: {json}`` events out (a ``Framer``).

    ``RUN_STARTED`` first; a ``STEP_STARTED``/``STEP_FINISHED`` pair per
    round; a text message per stretch of tokens; a reasoning message per
    stretch of reasoning; ``TOOL_CALL_START/ARGS/END`` and
    ``TOOL_CALL_RESULT`` per call; ``RUN_FINISHED`` or ``RUN_ERROR`` last.
    Extras (a tool's duration, non-fatal errors, the refusal mark, a reset's
    reason) are ``CUSTOM`` events named ``streamengine.*``.
    """

    def __init__(self, errors: PublicErrors, run: RunInput, held: Iterable[str] = ()) -> None:
        super().__init__(errors)
        self._run = run
        #: The run ended at a held call's interrupt (the answer comes in the next run's ``resume``).
        self.parked = False
        self._count = 0
        self._round = 0
        self._step: Optional[str] = None
        self._text: Optional[List[str]] = None  # the open text message's deltas
        self._text_id = ""
        self._content_prefix = ""
        self._reasoning: Optional[str] = None
        self._thoughts: List[str] = []  # the open reasoning message's deltas
        # Calls shown in the run this one resumes are not shown again: their results come alone.
        self._held = frozenset(held)
        self._shown: Set[str] = set(self._held)  # calls whose card the client has
        # What the run said so far, for MESSAGES_SNAPSHOT: (round, message) with text as lists of deltas.
        self._said: List[Any] = []

    # --- Framer -----------------------------------------------------------------------------
    def opening(self) -> bytes:
        return OK_FRAME + data_frame({"type": "RUN_STARTED", "threadId": self._run.thread_id,
                                      "runId": self._run.run_id})

    def _text_delta(self, text: str) -> bytes:
        head = self._open_text() if self._text is None else b""
        assert self._text is not None
        self._text.append(text)
        return head + (self._content_prefix + _json_string(text) + "}\n\n").encode("ascii")

    def failure(self, exc: BaseException) -> bytes:
        return self.run_error(self._errors.failure_text(exc))

    def closing(self) -> bytes:
        if self._ended:
            return b""
        return self.run_error(self._errors.public("the answer ended without finishing",
                                                   "the run stopped before its done event"))

    # --- messages ------------------------------------------------------------------------------
    def _new_id(self, kind: str) -> str:
        self._count += 1
        return f"{self._run.run_id}-{kind}-{self._count}"

    def _open_step(self) -> bytes:
        if self._step is not None:
            return b""
        self._step = f"round {max(self._round, 1)}"
        return data_frame({"type": "STEP_STARTED", "stepName": self._step})

    def _open_text(self) -> bytes:
        head = self._close_reasoning() + self._open_step()
        self._text_id = self._new_id("text")
        self._text = []
        self._said.append((self._round, {"id": self._text_id, "role": "assistant", "content": self._text}))
        self._content_prefix = f'data: {{"type":"TEXT_MESSAGE_CONTENT","messageId":"{self._text_id}","delta":'
        return head + data_frame({"type": "TEXT_MESSAGE_START", "messageId": self._text_id, "role": "assistant"})

    def _close_text(self) -> bytes:
        self._prose.reset()
        if self._text is None:
            return b""
        self._text = None
        return data_frame({"type": "TEXT_MESSAGE_END", "messageId": self._text_id})

    def _close_reasoning(self) -> bytes:
        if self._reasoning is None:
            return b""
        part, self._reasoning = self._reasoning, None
        return data_frame({"type": "REASONING_MESSAGE_END", "messageId": part}) + \
            data_frame({"type": "REASONING_END", "messageId": part})

    def _close_parts(self) -> bytes:
        return self._close_text() + self._close_reasoning()

    def _finish_step(self) -> bytes:
        closed = self._close_parts()
        if self._step is None:
            return closed
        step, self._step = self._step, None
        return closed + data_frame({"type": "STEP_FINISHED", "stepName": step})

    def run_error(self, message: str) -> bytes:
        """``RUN_ERROR`` with ``message`` (already public): the run's one terminal event."""
        if self._ended:
            return b""
        self._ended = True
        return data_frame({"type": "RUN_ERROR", "message": message, "code": "streamengine_error"})

    def _custom(self, name: str, value: Dict[str, Any]) -> bytes:
        return data_frame({"type": "CUSTOM", "name": f"streamengine.{name}", "value": value})

    # --- events ------------------------------------------------------------------------------------
    def _round_event(self, event: object) -> bytes:
        head = self._finish_step()
        number = getattr(event, "round", None)
        self._round = number if isinstance(number, int) else self._round + 1
        return head + self._open_step()

    def _reasoning_event(self, event: object) -> bytes:
        text = getattr(event, "text", "")
        if not isinstance(text, str) or not text:
            return b""
        head = b""
        if self._reasoning is None:
            head = self._close_text() + self._open_step()
            self._reasoning = self._new_id("reasoning")
            self._thoughts = []
            self._said.append((self._round, {"id": self._reasoning, "role": "reasoning", "content": self._thoughts}))
            head += data_frame({"type": "REASONING_START", "messageId": self._reasoning}) + data_frame(
                {"type": "REASONING_MESSAGE_START", "messageId": self._reasoning, "role": "reasoning"})
        self._thoughts.append(text)
        return head + data_frame({"type": "REASONING_MESSAGE_CONTENT", "messageId": self._reasoning,
                                  "delta": text})

    def _tool_start(self, event: object) -> bytes:
        call = getattr(event, "call", None)
        if not isinstance(call, ToolCall) or call.id in self._held:  # an approved call was shown before it was held
            return b""
        return self._show_call(call)

    def _show_call(self, call: ToolCall) -> bytes:
        head = self._close_parts() + self._open_step()
        self._shown.add(call.id)
        parent = self._new_id("call")
        self._said.append((0, {"id": parent, "role": "assistant", "toolCalls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}))
        chunks = [data_frame({"type": "TOOL_CALL_START", "toolCallId": call.id, "toolCallName": call.name,
                              "parentMessageId": parent})]
        if call.arguments:
            chunks.append(data_frame({"type": "TOOL_CALL_ARGS", "toolCallId": call.id, "delta": call.arguments}))
        chunks.append(data_frame({"type": "TOOL_CALL_END", "toolCallId": call.id}))
        return head + b"".join(chunks)

    def _tool_result(self, event: object) -> bytes:
        result = getattr(event, "result", None)
        call_id = getattr(result, "call_id", None)
        if not isinstance(call_id, str):
            return b""
        head = b""
        if call_id not in self._shown:  # it never started (skipped): the call is still shown
            head = self._show_call(result_call(event, result, call_id))
        skipped = getattr(event, "skipped", None)
        ok = bool(getattr(result, "ok", False))
        content = getattr(result, "text", "") if ok else str(self._errors.tool_error_text(result, skipped) or "failed")
        message_id = self._new_id("result")
        self._said.append((0, {"id": message_id, "role": "tool", "toolCallId": call_id, "content": content,
                               **({} if ok else {"error": content})}))
        return head + data_frame({"type": "TOOL_CALL_RESULT", "messageId": message_id, "toolCallId": call_id,
                                  "content": content, "role": "tool"}) + self._custom("tool", {
            "toolCallId": call_id, "ok": ok, "durationS": getattr(result, "duration_s", None), "skipped": skipped,
            "timedOut": getattr(result, "timed_out", False)})

    def _refusal(self, event: object) -> bytes:
        text = getattr(event, "text", "")
        head = self._close_parts() + self._open_step()
        message_id = self._new_id("refusal")
        shown = text if isinstance(text, str) else ""
        self._said.append((0, {"id": message_id, "role": "assistant", "content": [shown]}))
        return head + b"".join([
            data_frame({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}),
            data_frame({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": shown or " "}),
            data_frame({"type": "TEXT_MESSAGE_END", "messageId": message_id}),
            self._custom("refusal", {"messageId": message_id}),
        ])

    def _error(self, event: object) -> bytes:
        message = self._errors.error_text(event)
        if getattr(event, "fatal", True):
            return self.run_error(message)
        return self._custom("error", {"message": message, "requestId": self._errors.request_id})

    def _reset(self, event: object) -> bytes:
        """The round's text is taken back: the client's messages are replaced by what survives."""
        number = getattr(event, "round", None)
        head = self._close_parts()
        self._said = [(r, m) for r, m in self._said if r != number]
        return head + self._custom("reset", {"round": number, "reason": getattr(event, "reason", None)}) + \
            data_frame({"type": "MESSAGES_SNAPSHOT", "messages": self._snapshot()})

    def _snapshot(self) -> List[Any]:
        said = [dict(m, content="".join(m["content"])) if isinstance(m.get("content"), list) else m
                for _, m in self._said]
        return [*self._run.raw_messages, *said]

    def _approval_request(self, event: object) -> bytes:
        """A held call: its tool call, then ``RUN_FINISHED`` with an ``interrupt`` outcome for it.

        The AG-UI run ends there (:attr:`parked`); the engine's run waits in
        its log, and the client's next run answers with a ``resume`` entry
        whose ``interruptId`` is the call's id (:func:`resume_entries`).
        """
        call = held_call(event)
        if call is None:
            return b""
        head = b"" if call.id in self._shown else self._show_call(call)
        self._ended = self.parked = True
        interrupt = {"id": call.id, "reason": "tool_approval", "toolCallId": call.id,
                     "message": f"Allow the tool call {call.name}?"}
        return head + self._finish_step() + data_frame({
            "type": "RUN_FINISHED", "threadId": self._run.thread_id, "runId": self._run.run_id,
            "outcome": {"type": "interrupt", "interrupts": [interrupt]}})

    def _done(self, event: object) -> bytes:
        result = getattr(event, "result", None)
        self._ended = True
        finished: Dict[str, Any] = {
            "type": "RUN_FINISHED", "threadId": self._run.thread_id, "runId": self._run.run_id,
            "result": {"answer": self._errors.answer_text(getattr(result, "answer", None)),
                       "refusal": getattr(result, "refusal", None), "cutOff": getattr(result, "cut_off", None),
                       "telemetry": self._errors.telemetry(getattr(result, "telemetry", None))}}
        usage = _usage(getattr(result, "usage", None))
        if usage is not None:
            finished["usage"] = [usage]
        return self._finish_step() + data_frame(finished)

    _HANDLERS: ClassVar[Dict[str, Callable[[AgUiStream, object], bytes]]] = {
        "round": _round_event, "reasoning": _reasoning_event, "tool_start": _tool_start,
        "tool_result": _tool_result, "refusal": _refusal, "error": _error, "reset": _reset, "done": _done,
        "approval_request": _approval_request,
    }


def _usage(usage: object) -> Optional[Dict[str, int]]:
    """The run's token counts in AG-UI's terms (None when the provider reported none)."""
    if usage is None:
        return None
    pairs = (("inputTokens", "prompt_tokens"), ("outputTokens", "completion_tokens"), ("totalTokens", "total_tokens"),
             ("cachedInputTokens", "cached_tokens"), ("reasoningTokens", "reasoning_tokens"))
    fields: Dict[str, Any] = usage if isinstance(usage, dict) else {}  # a run log's done frame has a dict
    counts = {key: fields.get(name) if fields else getattr(usage, name, None) for key, name in pairs}
    return {key: value for key, value in counts.items() if isinstance(value, int) and value >= 0}


class AgUiLogRender(LogRender):
    """A run's log frames as one AG-UI run's events."""

    def __init__(self, run: RunInput, request_id: str, held: Iterable[str] = ()) -> None:
        self._stream: AgUiStream = AgUiStream(LoggedErrors(request_id), run, held)

    def error(self, code: str, message: str) -> bytes:
        return self._stream.run_error(message)

    def done(self) -> bytes:
        return b""  # an AG-UI client would try to parse a [DONE]
