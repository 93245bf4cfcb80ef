"""FakeProvider's Anthropic wire: the same scripted steps, spoken as the Messages API speaks.

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
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._steps import Step, continues_call

#: OpenAI finish reasons (what ``s.finish`` takes) -> Anthropic ``stop_reason``.
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                "content_filter": "refusal"}
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
            return step.value
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
        self.open: Optional[Tuple[str, Any]] = None  # ("text"|"thinking"|"tool_use", openai index, id)
        self.stopped = False

    def fresh(self) -> AnthropicEncoder:
        """A new encoder for the same answer (to measure a Content-Length without spending this one)."""
        return AnthropicEncoder(self.message_id, self.model, self.steps)

    def frame(self, step: Step) -> bytes:
        if step.kind == "raw":
            return step.value
        out = [] if self.started else [self._message_start()]
        self.started = True
        out.extend(self._events(step))
        return b"".join(out)

    def _message_start(self) -> bytes:
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
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
        raise ValueError(f"FakeProvider's Anthropic wire cannot encode a {kind!r} step")

    def _delta(self, delta: Dict[str, Any]) -> List[bytes]:
        out: List[bytes] = []
        if delta.get("reasoning_content"):
            out += self._into(("thinking", None, None), {"type": "thinking", "thinking": ""})
            out.append(self._block_delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
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
                 usage: Optional[Tuple[int, int]]) -> Dict[str, Any]:
    """A non-streamed Anthropic ``message`` answer from a turn's aggregated steps."""
    blocks: List[Dict[str, Any]] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": _SIGNATURE})
    if content:
        blocks.append({"type": "text", "text": content})
    for position, call in sorted(calls.items()):
        try:
            arguments = json.loads(call["arguments"]) if call["arguments"].strip() else {}
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call["id"] or f"toolu_fake_{position}",
                       "name": call["name"] or "", "input": arguments})
    finish = finish_reason or ("tool_calls" if calls else "stop")
    prompt, completion = usage or (1, 1)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": STOP_REASONS.get(finish, finish), "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion}}
