"""One chat request answered from one scripted turn, streamed or whole, in the provider's wire format.

FakeProvider's request handler hands each chat request here: the turn's
steps become frames (Chat Completions chunks, or an encoder's Anthropic or
Responses events), written with the turn's timing and framing.
"""
from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._messages import StopReason
from . import _steps as wire_steps
from ._steps import Step, delay, raw, reasoning_of
from ._wires import AnthropicEncoder, ResponsesEncoder, error_body, failed_body, message_body, response_body

if TYPE_CHECKING:
    from ._provider import _Handler


def shut_down(sock: socket.socket) -> None:
    """Shut both directions (a stalled client's read ends now); a socket already gone is no error."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Exchange:
    """One chat-completions request answered from one turn."""

    def __init__(self, handler: _Handler, payload: Any) -> None:
        self.h = handler
        self.provider = handler.provider
        self.payload = payload if isinstance(payload, dict) else {}
        self.model = str(self.payload.get("model") or "fake-model")
        self.id = self.provider._next_id()
        self.created = int(time.time())
        self.framing = self.provider.framing
        self.pending: List[bytes] = []
        self.anthropic: Optional[AnthropicEncoder] = None
        self.responses: Optional[ResponsesEncoder] = None

    def run(self) -> None:
        turn = self.provider._next_turn(self.payload)
        if turn is None:
            message = "FakeProvider: no scripted turn left"
            self.h._send_json(500, error_body(message) if self.provider.wire == "anthropic"
                              else {"error": {"message": message, "type": "server_error"}})
            return
        if self.provider.wire == "anthropic":
            self.anthropic = AnthropicEncoder(self.id, self.model, turn.steps)
        elif self.provider.wire == "responses":
            self.responses = ResponsesEncoder(self.id, self.model, turn.steps, self._wants_encrypted())
        try:
            if self.payload.get("stream"):
                self._stream(list(turn.steps))
            else:
                self._whole(list(turn.steps))
        except (OSError, ValueError):
            self.h.close_connection = True  # the client went away mid-answer
            self._client_left()

    def _wants_encrypted(self) -> bool:
        """Whether the request's ``include`` asks for reasoning items' ``encrypted_content``."""
        include = self.payload.get("include")
        return isinstance(include, list) and "reasoning.encrypted_content" in include

    def _client_left(self) -> None:
        """Count an answer cut short by its client (not by the provider closing)."""
        if not self.provider._closing.is_set():
            self.provider._note_client_gone()

    # -- shared step handling ----------------------------------------------------------

    def _timing(self, step: Step) -> bool:
        """Run a timing step; False means stop (provider closing or client gone)."""
        if step.kind == "delay":
            return self.h.pause(seconds=step.value)
        if step.kind == "wait":
            return self.h.pause(seconds=step.options["timeout"], event=step.value)
        step.value.set()  # signal
        return True

    def _abandon(self) -> None:
        """Stop answering: the client left, the provider closes, or a drop/stall step ended it."""
        if self.h.client_gone():
            self._client_left()
        self.h.close_connection = True
        shut_down(self.h.connection)

    def _pre_header(self, step: Step) -> None:
        if step.kind == "http_error":
            body = step.options["body"]
            if isinstance(body, (dict, list)):
                data = json.dumps(body).encode("utf-8")
            elif isinstance(body, str):
                data = body.encode("utf-8")
            else:
                data = body or b""
            self.h._send_body(step.value, data, step.options["content_type"], step.options["headers"])
        elif step.kind == "stall_before_headers":
            self.h.pause()
            self._abandon()
        else:  # drop
            self._abandon()

    # -- streamed answers --------------------------------------------------------------

    def _frame(self, step: Step) -> bytes:
        if self.anthropic is not None:
            return self.anthropic.frame(step)
        if self.responses is not None:
            return self.responses.frame(step)
        if step.kind in ("raw", "sse"):
            data: bytes = step.value
            return data
        if step.kind == "done":
            return b"data: [DONE]\n\n"
        if step.kind == "redacted":  # Chat Completions has no hidden reasoning to send
            return b""
        if step.kind == "error_frame":
            return _sse(step.value)
        chunk: Dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk",
                                 "created": self.created, "model": self.model}
        if step.kind == "usage":
            prompt, completion = step.value
            chunk["choices"] = []
            chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
        elif step.kind == "finish":
            chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": step.value}]
        else:
            chunk["choices"] = [{"index": 0, "delta": step.value, "finish_reason": None}]
        return _sse(chunk)

    def _stream(self, body: List[Step]) -> None:
        first = next((i for i, st in enumerate(body) if st.kind not in wire_steps._TIMING), None)
        if first is not None and body[first].kind in wire_steps._PRE_HEADER:
            for step in body[:first]:
                if not self._timing(step):
                    return self._abandon()
            return self._pre_header(body[first])
        self._send_stream_headers(body)
        for step in body:
            if step.kind in wire_steps._FRAMES:
                self.pending.append(self._frame(step))
                continue
            self._flush()
            if step.kind in wire_steps._TIMING:
                if not self._timing(step):
                    return self._abandon()
            elif step.kind == "stall":
                self.h.pause()
                return self._abandon()
            elif step.kind == "forever":
                self._forever(step)
                return self._abandon()
            elif step.kind == "trickle":
                if not self._trickle(step):
                    return self._abandon()
            elif step.kind == "drop":
                return self._abandon()
            elif step.kind == "end":
                break
        self._flush()
        self._end_body()

    def _forever(self, step: Step) -> None:
        data = b"".join(self._frame(frame) for frame in step.value)
        while True:
            self.pending.append(data)
            self._flush()
            if not self.h.pause(seconds=step.options["every"]):
                return

    def _trickle(self, step: Step) -> bool:
        for i in range(len(step.value)):
            if not self.h.pause(seconds=step.options["interval"]):
                return False
            self.pending.append(step.value[i:i + 1])
            self._flush()
        return True

    def _send_stream_headers(self, body: List[Step]) -> None:
        h = self.h
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream; charset=utf-8")
        h.send_header("Cache-Control", "no-cache")
        if self.framing == "chunked":
            h.send_header("Transfer-Encoding", "chunked")
        elif self.framing == "length":
            h.send_header("Content-Length", str(self._declared_length(body)))
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()

    def _declared_length(self, body: List[Step]) -> int:
        total = 0
        wire = self.anthropic or self.responses
        encoder = wire.fresh() if wire is not None else None
        for step in body:
            if step.kind in wire_steps._FRAMES:
                total += len(encoder.frame(step) if encoder is not None else self._frame(step))
            elif step.kind == "trickle":
                total += len(step.value)
            elif step.kind in ("stall", "drop"):
                return total + wire_steps._DROP_PHANTOM_BYTES
            elif step.kind == "forever":
                return total + wire_steps._FOREVER_PHANTOM_BYTES
            elif step.kind == "end":
                break
        return total

    def _flush(self) -> None:
        if not self.pending:
            return
        data, self.pending = b"".join(self.pending), []
        if self.framing == "chunked":
            data = b"%X\r\n%s\r\n" % (len(data), data)
        self.h.wfile.write(data)

    def _end_body(self) -> None:
        if self.framing == "chunked":
            self.h.wfile.write(b"0\r\n\r\n")
        elif self.framing == "close":
            self.h.close_connection = True

    # -- whole (non-stream) answers ------------------------------------------------------

    def _whole(self, body: List[Step]) -> None:
        agg = _Aggregate()
        for step in body:
            if step.kind in wire_steps._TIMING:
                if not self._timing(step):
                    return self._abandon()
            elif step.kind in wire_steps._PRE_HEADER:
                return self._pre_header(step)
            elif step.kind in ("stall", "forever"):  # nothing is sent before a whole answer
                self.h.pause()
                return self._abandon()
            elif step.kind == "trickle":  # a whole answer cannot trickle: wait as long, then send
                if not self._timing(delay(step.options["interval"] * len(step.value))):
                    return self._abandon()
                agg.add(raw(step.value))
            elif step.kind == "error_frame":
                error = step.value["error"]
                if self.responses is not None:
                    return self.h._send_json(200, failed_body(self.id, self.model, self.created, error))
                return self.h._send_json(200, step.value if self.anthropic is None
                                         else error_body(error["message"], error.get("type")))
            else:
                agg.add(step)
        if agg.raw is not None:
            return self.h._send_body(200, agg.raw, "application/json")
        if self.anthropic is not None:
            return self.h._send_json(200, message_body(
                self.id, self.model, "".join(agg.content), "".join(agg.reasoning), agg.calls,
                agg.finish_reason, agg.usage, agg.redacted))
        if self.responses is not None:
            return self.h._send_json(200, response_body(
                self.id, self.model, self.created, "".join(agg.content), "".join(agg.reasoning), agg.calls,
                agg.finish_reason, agg.usage, agg.redacted, self._wants_encrypted()))
        self.h._send_json(200, agg.completion(self.id, self.created, self.model))


class _Aggregate:
    """The non-stream answer built from a turn's frames."""

    def __init__(self) -> None:
        self.content: List[str] = []
        self.reasoning: List[str] = []
        self.reasoning_field = "reasoning_content"
        self.redacted: List[str] = []
        self.calls: Dict[int, Dict[str, Any]] = {}
        self.finish_reason: Optional[str] = None
        self.usage: Optional[Tuple[int, int]] = None
        self.raw: Optional[bytes] = None

    def add(self, step: Step) -> None:
        if step.kind == "delta":
            delta = step.value
            self.content.append(delta.get("content") or "")
            self.reasoning.append(reasoning_of(delta))
            if delta.get("reasoning"):
                self.reasoning_field = "reasoning"
            for call in delta.get("tool_calls", ()):
                slot = self.calls.setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
                function = call.get("function", {})
                slot["id"] = slot["id"] or call.get("id")
                slot["name"] = slot["name"] or function.get("name")
                slot["arguments"] += function.get("arguments") or ""
        elif step.kind == "finish":
            self.finish_reason = step.value
        elif step.kind == "usage":
            self.usage = step.value
        elif step.kind == "redacted":
            self.redacted.append(step.value)
        elif step.kind == "raw":
            self.raw = (self.raw or b"") + step.value

    def completion(self, id: str, created: int, model: str) -> Dict[str, Any]:
        message: Dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if any(self.reasoning):
            message[self.reasoning_field] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {"id": c["id"] or f"call_{i}", "type": "function",
                 "function": {"name": c["name"] or "", "arguments": c["arguments"]}}
                for i, c in sorted(self.calls.items())
            ]
        prompt, completion = self.usage or (1, 1)
        return {
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": self.finish_reason
                         or (StopReason.TOOL_CALLS if self.calls else StopReason.STOP)}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }


def _sse(payload: Any) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode("utf-8") + b"\n\n"

