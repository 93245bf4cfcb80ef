"""FakeProvider's other wires: the same scripted steps spoken as Anthropic Messages and OpenAI Responses.

FakeProvider's Anthropic wire: the same scripted steps, spoken as the Messages API speaks.

``FakeProvider(wire="anthropic")`` serves ``POST /v1/messages``.  A turn's
steps are the OpenAI-shaped ones (``s.text``, ``s.tool_call``, ``s.finish``...)
and are encoded here, so one script can be played on either wire:

=====================  ==========================================================
step                   Anthropic events
=====================  ==========================================================
(first frame)          ``message_start`` (input tokens from the turn's ``usage``)
``text``               a ``text`` block: ``content_block_start``, ``text_delta``
``reasoning``          a ``thinking`` block: ``thinking_delta``; a
                       ``signature_delta`` before its stop, as the API sends
``redacted_reasoning`` a ``redacted_thinking`` block (``data``), started and stopped
``tool_call``          a ``tool_use`` block per call (a new OpenAI index or id
                       starts one), ``input_json_delta`` per arguments fragment
``empty_delta``        ``ping`` (nothing meaningful)
``finish``             ``content_block_stop`` of the open block, then
                       ``message_delta`` (``stop_reason``, output tokens)
``usage``              nothing of its own: its counts go into ``message_start``
                       and ``message_delta``
``done``               ``message_stop``
``error_frame``        an ``error`` event, ``{"type": "error", "error": {...}}``
``comment``/``ping``   as they are (``ping_event`` is already Anthropic's ``ping``)
``raw``                the bytes, verbatim (no ``message_start`` before them)
=====================  ==========================================================

The encoder is stateful (a block stays open across steps), so each answer
gets its own, and a length-framed answer measures itself with a fresh one.

FakeProvider's Responses wire: the same scripted steps, spoken as ``POST /v1/responses`` speaks.

``FakeProvider(wire="responses")`` serves ``POST /v1/responses`` (and
``/v1/embeddings``).  A turn's steps are the OpenAI-shaped ones and are
encoded here, so one script plays on every wire.  Every event carries its
``sequence_number`` (0, 1, ...) and an ``event:`` line equal to its ``type``:

=====================  ==========================================================
step                   Responses events
=====================  ==========================================================
(first frame)          ``response.created``, ``response.in_progress``
``text``               a ``message`` item: ``output_item.added``,
                       ``content_part.added``, ``output_text.delta``
``reasoning``          a ``reasoning`` item: ``reasoning_summary_part.added``,
                       ``reasoning_summary_text.delta``; the item has
                       ``encrypted_content`` when the request's ``include``
                       asked for ``reasoning.encrypted_content``
``redacted_reasoning`` a ``reasoning`` item without summary, the data as its
                       ``encrypted_content``
``{"refusal": ...}``   a ``message`` item with a ``refusal`` part: ``refusal.delta``
``tool_call``          a ``function_call`` item per call (a new OpenAI index or id
                       starts one; ``call_id`` is the id, the item id is
                       ``fc_...``), ``function_call_arguments.delta`` per fragment
``empty_delta``        ``response.in_progress`` (nothing meaningful)
``finish``             the open item's ``*.done`` events and ``output_item.done``,
                       then ``response.completed`` -- or, for ``length`` /
                       ``content_filter``, ``response.incomplete`` with
                       ``incomplete_details.reason`` ``max_output_tokens`` /
                       ``content_filter``; both with the turn's usage
``usage``              nothing of its own: its counts go into the final event
``done``               ``response.completed`` if ``finish`` did not end it, else nothing
``error_frame``        an ``error`` event (``{"type": "error", "error": {...}}``,
                       as the API sends it), then ``response.failed``
``comment``/``ping``   as they are
``raw``                the bytes, verbatim (no ``response.created`` before them)
=====================  ==========================================================

The encoder is stateful (an item stays open across steps), so each answer
gets its own, and a length-framed answer measures itself with a fresh one.
"""
from __future__ import annotations

import base64
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._messages import StopReason
from ._steps import Step, continues_call, reasoning_of

#: OpenAI finish reasons (what ``s.finish`` takes) -> Anthropic ``stop_reason``.
STOP_REASONS: Dict[str, str] = {StopReason.STOP: "end_turn", StopReason.TOOL_CALLS: "tool_use",
                                 StopReason.LENGTH: "max_tokens", StopReason.CONTENT_FILTER: "refusal"}
_SIGNATURE = "ZmFrZS1zaWduYXR1cmU="  # what a thinking block's signature_delta carries here


def event(kind: str, payload: Dict[str, Any]) -> bytes:
    """One named SSE event, as the API writes them: ``event: X`` then ``data: {"type": "X", ...}``."""
    data = json.dumps({"type": kind, **payload}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


def error_body(message: str, kind: Optional[str] = None) -> Dict[str, Any]:
    """An Anthropic error object (HTTP error bodies and ``error`` events alike)."""
    return {"type": "error", "error": {"type": kind or "api_error", "message": message}}


def _usage_of(steps: Sequence[Step]) -> Tuple[int, int]:
    for step in steps:
        if step.kind == "usage":
            counts: Tuple[int, int] = step.value
            return counts
    return (1, 1)


class AnthropicEncoder:
    """Encodes one answer's frame steps; ``frame(step)`` returns the bytes for that step."""

    def __init__(self, message_id: str, model: str, steps: Sequence[Step]) -> None:
        self.message_id = message_id
        self.model = model
        self.steps = tuple(steps)
        self.prompt_tokens, self.completion_tokens = _usage_of(self.steps)
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: Optional[Tuple[str, Any, Any]] = None  # ("text"|"thinking"|"tool_use", openai index, id)
        self.stopped = False

    def fresh(self) -> AnthropicEncoder:
        """A new encoder for the same answer (to measure a Content-Length without spending this one)."""
        return AnthropicEncoder(self.message_id, self.model, self.steps)

    def frame(self, step: Step) -> bytes:
        if step.kind == "raw":
            data: bytes = step.value
            return data
        out = [] if self.started else [self._message_start()]
        self.started = True
        out.extend(self._events(step))
        return b"".join(out)

    def _message_start(self) -> bytes:
        message: Dict[str, Any] = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 1}}
        return event("message_start", {"message": message})

    def _events(self, step: Step) -> List[bytes]:
        kind = step.kind
        if kind == "sse":
            return [step.value]
        if kind == "delta":
            return self._delta(step.value)
        if kind == "finish":
            delta = {"stop_reason": STOP_REASONS.get(step.value, step.value), "stop_sequence": None}
            return self._close() + [event("message_delta", {"delta": delta,
                                                            "usage": {"output_tokens": self.completion_tokens}})]
        if kind == "usage":
            return []
        if kind == "done":
            return self._close() + [event("message_stop", {})]
        if kind == "error_frame":
            error = step.value["error"]
            return [event("error", {"error": {"type": error.get("type") or "api_error",
                                              "message": error["message"]}})]
        if kind == "redacted":
            out = self._into(("redacted_thinking", None, None), {"type": "redacted_thinking", "data": step.value})
            return out + self._close()
        raise ValueError(f"FakeProvider's Anthropic wire cannot encode a {kind!r} step")

    def _delta(self, delta: Dict[str, Any]) -> List[bytes]:
        out: List[bytes] = []
        thought = reasoning_of(delta)
        if thought:
            out += self._into(("thinking", None, None), {"type": "thinking", "thinking": ""})
            out.append(self._block_delta({"type": "thinking_delta", "thinking": thought}))
        if delta.get("content"):
            out += self._into(("text", None, None), {"type": "text", "text": ""})
            out.append(self._block_delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls", ()):
            out += self._tool_call(call)
        if not out and not delta.get("tool_calls"):
            out.append(event("ping", {}))  # an empty delta: nothing meaningful happens
        return out

    def _tool_call(self, call: Dict[str, Any]) -> List[bytes]:
        out: List[bytes] = []
        function = call.get("function", {})
        if not continues_call(self.open, "tool_use", call):
            call_id = call.get("id") or f"toolu_fake_{self.blocks}"
            out += self._into(("tool_use", call["index"], call_id),
                              {"type": "tool_use", "id": call_id, "name": function.get("name") or "", "input": {}})
        if function.get("arguments"):
            out.append(self._block_delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return out

    def _into(self, key: Tuple[str, Any, Any], block: Dict[str, Any]) -> List[bytes]:
        """Open ``block`` unless a block of that kind (and call) is open; close the one that is."""
        if self.open is not None and self.open[0] == key[0] and key[0] != "tool_use":
            return []
        out = self._close()
        self.open = key
        self.blocks += 1
        out.append(event("content_block_start", {"index": self.blocks - 1, "content_block": block}))
        return out

    def _block_delta(self, delta: Dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": self.blocks - 1, "delta": delta})

    def _close(self) -> List[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open[0] == "thinking":
            out.append(self._block_delta({"type": "signature_delta", "signature": _SIGNATURE}))
        self.open = None
        out.append(event("content_block_stop", {"index": self.blocks - 1}))
        return out


def message_body(message_id: str, model: str, content: str, reasoning: str,
                 calls: Dict[int, Dict[str, Any]], finish_reason: Optional[str],
                 usage: Optional[Tuple[int, int]], redacted: Sequence[str] = ()) -> Dict[str, Any]:
    """A non-streamed Anthropic ``message`` answer from a turn's aggregated steps."""
    blocks: List[Dict[str, Any]] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": _SIGNATURE})
    blocks.extend({"type": "redacted_thinking", "data": data} for data in redacted)
    if content:
        blocks.append({"type": "text", "text": content})
    for position, call in sorted(calls.items()):
        try:
            arguments = json.loads(call["arguments"]) if call["arguments"].strip() else {}
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call["id"] or f"toolu_fake_{position}",
                       "name": call["name"] or "", "input": arguments})
    finish = finish_reason or (StopReason.TOOL_CALLS if calls else StopReason.STOP)
    prompt, completion = usage or (1, 1)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": STOP_REASONS.get(finish, finish), "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion}}


#: OpenAI finish reasons (what ``s.finish`` takes) -> ``incomplete_details.reason``.
INCOMPLETE_REASONS: Dict[str, str] = {StopReason.LENGTH: "max_output_tokens",
                                       StopReason.CONTENT_FILTER: "content_filter"}


def _responses_usage_of(steps: Sequence[Step]) -> Tuple[int, int]:
    for step in steps:
        if step.kind == "usage":
            counts: Tuple[int, int] = step.value
            return counts
    return (1, 1)


def usage_object(prompt: int, completion: int) -> Dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def response_object(response_id: str, model: str, created_at: int, status: str, output: List[Dict[str, Any]],
                    usage: Optional[Tuple[int, int]] = None, incomplete: Optional[str] = None,
                    error: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A ``response`` object as the API returns it (and embeds in its lifecycle events)."""
    return {"id": response_id, "object": "response", "created_at": created_at, "status": status,
            "model": model, "output": output, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": None, "metadata": {}, "parallel_tool_calls": True, "temperature": 1.0,
            "top_p": 1.0, "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
            "usage": usage_object(*usage) if usage is not None else None}


def _status_of(finish: Optional[str]) -> Tuple[str, Optional[str]]:
    incomplete = INCOMPLETE_REASONS.get(finish or "")
    return ("incomplete", incomplete) if incomplete else ("completed", None)


class ResponsesEncoder:
    """Encodes one answer's frame steps; ``frame(step)`` returns the bytes for that step."""

    def __init__(self, response_id: str, model: str, steps: Sequence[Step], encrypted: bool = False) -> None:
        self.response_id = response_id
        self.model = model
        self.steps = tuple(steps)
        self.encrypted = encrypted  # the request asked for reasoning.encrypted_content
        self.usage = _responses_usage_of(self.steps)
        self.created_at = int(time.time())
        self.sequence = 0
        self.started = False
        self.ended = False
        self.output: List[Dict[str, Any]] = []  # finished items, for the final response object
        self.open: Optional[Dict[str, Any]] = None  # the item being streamed
        self.open_key: Optional[Tuple[str, Any, Any]] = None  # ("message"|"reasoning"|"function_call", index, id)
        self.calls = 0

    def fresh(self) -> ResponsesEncoder:
        """A new encoder for the same answer (to measure a Content-Length without spending this one)."""
        return ResponsesEncoder(self.response_id, self.model, self.steps, self.encrypted)

    def frame(self, step: Step) -> bytes:
        if step.kind == "raw":
            data: bytes = step.value
            return data
        out = [] if self.started else self._start()
        self.started = True
        out.extend(self._events(step))
        return b"".join(out)

    # -- events ------------------------------------------------------------------------

    def event(self, kind: str, **payload: Any) -> bytes:
        """One event: ``event: TYPE`` and ``data: {"type": TYPE, "sequence_number": N, ...}``."""
        data = json.dumps({"type": kind, "sequence_number": self.sequence, **payload},
                          ensure_ascii=False, separators=(",", ":"))
        self.sequence += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def _response(self, status: str, **extra: Any) -> Dict[str, Any]:
        return response_object(self.response_id, self.model, self.created_at, status, list(self.output), **extra)

    def _start(self) -> List[bytes]:
        return [self.event("response.created", response=self._response("in_progress")),
                self.event("response.in_progress", response=self._response("in_progress"))]

    def _events(self, step: Step) -> List[bytes]:
        kind = step.kind
        if kind == "sse":
            return [step.value]
        if kind == "delta":
            return self._delta(step.value)
        if kind == "finish":
            return self._end(step.value)
        if kind == "usage":
            return []
        if kind == "done":
            return [] if self.ended else self._end(StopReason.STOP)
        if kind == "error_frame":
            return self._error(step.value["error"])
        if kind == "redacted":
            return self._redacted(step.value)
        raise ValueError(f"FakeProvider's Responses wire cannot encode a {kind!r} step")

    def _redacted(self, data: str) -> List[bytes]:
        """A ``reasoning`` item with nothing to show: only its ``encrypted_content``."""
        out = self._close()
        index = len(self.output)
        item = {"id": f"rs_fake_{index}", "type": "reasoning", "summary": [], "encrypted_content": data}
        out.append(self.event("response.output_item.added", output_index=index, item=dict(item)))
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        return out

    def _end(self, finish: str) -> List[bytes]:
        out = self._close()
        status, incomplete = _status_of(finish)
        self.ended = True
        response = self._response(status, usage=self.usage, incomplete=incomplete)
        return out + [self.event(f"response.{status}", response=response)]

    def _error(self, error: Dict[str, Any]) -> List[bytes]:
        code = error.get("code") if error.get("code") is not None else error.get("type")
        nested = {"type": error.get("type") or "server_error", "code": code, "message": error["message"],
                  "param": None}
        self.ended = True
        failed = self._response("failed", error={"code": code or "server_error", "message": error["message"]})
        return [self.event("error", error=nested), self.event("response.failed", response=failed)]

    def _delta(self, delta: Dict[str, Any]) -> List[bytes]:
        out: List[bytes] = []
        thought = reasoning_of(delta)
        if thought:
            out += self._into(("reasoning", None, None))
            out.append(self._item_event("response.reasoning_summary_text.delta", summary_index=0, delta=thought))
            self._open_item()["summary"][0]["text"] += thought
        if delta.get("refusal"):
            out += self._into(("refusal", None, None))
            out.append(self._item_event("response.refusal.delta", content_index=0, delta=delta["refusal"]))
            self._open_item()["content"][0]["refusal"] += delta["refusal"]
        if delta.get("content"):
            out += self._into(("message", None, None))
            out.append(self._item_event("response.output_text.delta", content_index=0, delta=delta["content"],
                                        logprobs=[]))
            self._open_item()["content"][0]["text"] += delta["content"]
        for call in delta.get("tool_calls", ()):
            out += self._tool_call(call)
        if not out and not delta.get("tool_calls"):  # an empty delta: nothing meaningful happens
            out.append(self.event("response.in_progress", response=self._response("in_progress")))
        return out

    def _tool_call(self, call: Dict[str, Any]) -> List[bytes]:
        out: List[bytes] = []
        function = call.get("function", {})
        if not continues_call(self.open_key, "function_call", call):
            call_id = call.get("id") or f"call_fake_{self.calls}"
            self.calls += 1
            out += self._into(("function_call", call["index"], call_id), name=function.get("name") or "")
        if function.get("arguments"):
            out.append(self._item_event("response.function_call_arguments.delta", delta=function["arguments"]))
            self._open_item()["arguments"] += function["arguments"]
        return out

    # -- items -------------------------------------------------------------------------

    def _into(self, key: Tuple[str, Any, Any], name: str = "") -> List[bytes]:
        """Open an item of ``key``'s kind unless one is open (calls: that very call); close the open one."""
        if self.open_key is not None and self.open_key[0] == key[0] and key[0] != "function_call":
            return []
        out = self._close()
        index = len(self.output)
        if key[0] in ("message", "refusal"):
            item: Dict[str, Any] = {"id": f"msg_fake_{index}", "type": "message", "status": "in_progress",
                                    "role": "assistant", "content": []}
        elif key[0] == "reasoning":
            item = {"id": f"rs_fake_{index}", "type": "reasoning", "summary": []}
        else:
            item = {"id": f"fc_fake_{index}", "type": "function_call", "status": "in_progress",
                    "call_id": key[2], "name": name, "arguments": ""}
        out.append(self.event("response.output_item.added", output_index=index, item=json.loads(json.dumps(item))))
        self.open, self.open_key = item, key
        if key[0] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._item_event("response.content_part.added", content_index=0, part=dict(part)))
            item["content"].append(part)
        elif key[0] == "refusal":
            part = {"type": "refusal", "refusal": ""}
            out.append(self._item_event("response.content_part.added", content_index=0, part=dict(part)))
            item["content"].append(part)
        elif key[0] == "reasoning":
            part = {"type": "summary_text", "text": ""}
            out.append(self._item_event("response.reasoning_summary_part.added", summary_index=0, part=dict(part)))
            item["summary"].append(part)
        return out

    def _open_item(self) -> Dict[str, Any]:
        """The item being streamed (:meth:`_into` opened it before any of its deltas)."""
        assert self.open is not None, "a Responses item's delta came before its item was opened"
        return self.open

    def _item_event(self, kind: str, **payload: Any) -> bytes:
        return self.event(kind, item_id=self._open_item()["id"], output_index=len(self.output), **payload)

    def _close(self) -> List[bytes]:
        item, key = self.open, self.open_key
        if item is None or key is None:
            return []
        out: List[bytes] = []
        if key[0] == "message":
            part = item["content"][0]
            out.append(self._item_event("response.output_text.done", content_index=0, text=part["text"],
                                        logprobs=[]))
            out.append(self._item_event("response.content_part.done", content_index=0, part=part))
            item["status"] = "completed"
        elif key[0] == "refusal":
            part = item["content"][0]
            out.append(self._item_event("response.refusal.done", content_index=0, refusal=part["refusal"]))
            out.append(self._item_event("response.content_part.done", content_index=0, part=part))
            item["status"] = "completed"
        elif key[0] == "reasoning":
            part = item["summary"][0]
            out.append(self._item_event("response.reasoning_summary_text.done", summary_index=0, text=part["text"]))
            out.append(self._item_event("response.reasoning_summary_part.done", summary_index=0, part=part))
            if self.encrypted:
                item["encrypted_content"] = encrypted_content(part["text"])
        else:
            out.append(self._item_event("response.function_call_arguments.done", name=item["name"],
                                        arguments=item["arguments"]))
            item["status"] = "completed"
        out.append(self._item_event("response.output_item.done", item=item))
        self.output.append(item)
        self.open = self.open_key = None
        return out


def encrypted_content(summary: str) -> str:
    """What stands for a reasoning item's ``encrypted_content`` here: opaque, but tied to its summary."""
    return "gAAAAA-fake-" + base64.urlsafe_b64encode(summary.encode()).decode()


def response_body(response_id: str, model: str, created_at: int, content: str, reasoning: str,
                  calls: Dict[int, Dict[str, Any]], finish_reason: Optional[str],
                  usage: Optional[Tuple[int, int]], redacted: Sequence[str] = (),
                  encrypted: bool = False) -> Dict[str, Any]:
    """A non-streamed ``response`` object from a turn's aggregated steps."""
    output: List[Dict[str, Any]] = []
    if reasoning:
        item: Dict[str, Any] = {"id": "rs_fake_0", "type": "reasoning",
                                "summary": [{"type": "summary_text", "text": reasoning}]}
        if encrypted:
            item["encrypted_content"] = encrypted_content(reasoning)
        output.append(item)
    output.extend({"id": f"rs_fake_{len(output) + i}", "type": "reasoning", "summary": [], "encrypted_content": data}
                  for i, data in enumerate(redacted))
    if content:
        output.append({"id": f"msg_fake_{len(output)}", "type": "message", "status": "completed",
                       "role": "assistant",
                       "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}]})
    for position, call in sorted(calls.items()):
        output.append({"id": f"fc_fake_{len(output)}", "type": "function_call", "status": "completed",
                       "call_id": call["id"] or f"call_fake_{position}", "name": call["name"] or "",
                       "arguments": call["arguments"]})
    status, incomplete = _status_of(finish_reason)
    return response_object(response_id, model, created_at, status, output, usage or (1, 1), incomplete)


def failed_body(response_id: str, model: str, created_at: int, error: Dict[str, Any]) -> Dict[str, Any]:
    """A non-streamed failed ``response`` (what an ``error_frame`` step is when not streaming)."""
    code = error.get("code") if error.get("code") is not None else error.get("type")
    return response_object(response_id, model, created_at, "failed", [],
                           error={"code": code or "server_error", "message": error["message"]})
