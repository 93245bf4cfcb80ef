"""Anthropic stream events -> :class:`Chunk`, with the completion rule and error mapping.

A streamed message is ``message_start``, then per content block
``content_block_start`` / ``content_block_delta``... / ``content_block_stop``,
then ``message_delta`` (stop reason, final usage) and ``message_stop``;
``ping`` may come anywhere and an ``error`` event may replace the rest.

* text deltas become ``content``, thinking deltas ``reasoning`` (meaningful:
  a model that thinks is not idle); ``ping`` and the structural events yield
  nothing, so they never reset the idle timer;
* each ``tool_use`` block becomes one native call.  Its ToolCallDelta index
  is the block's position among the tool blocks (0, 1, ...), not the content
  block index, so calls are numbered as OpenAI numbers them; id and name
  come with ``content_block_start``, the arguments with each
  ``input_json_delta``;
* a block's ``content_block_stop`` is the moment its call is complete.  The
  engine's accumulator closes a call early once a *higher* index has started
  and its arguments parse, so the stop is expressed in those terms: the
  arguments are completed (``{}`` for a call without input) and an empty
  delta opens the next index.  The next tool block fills that index in; if
  none comes, the empty slot has no name and is dropped at the end.  So a
  call is dispatched at its block's stop, not at the end of the message;
* the answer is complete at ``message_stop``, or when the body ends after a
  ``message_delta`` with a stop reason (everything has arrived); any other
  end is a broken stream.  Usage is input tokens from ``message_start`` and
  output tokens from the last ``message_delta``;
* ``message_start`` gives the message's id: a chunk with nothing else in it
  (not model output, so it neither resets the idle timer nor counts as the
  first chunk).
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

from ..._messages import Chunk, ToolCallDelta, text_chunk
from ..http.typed_events import TypedEventParser
from .format import error_from_payload, finish_reason, merge_usage, usage_of


class _ToolBlock:
    __slots__ = ("argued", "index", "start_input")

    def __init__(self, index: int, start_input: Any) -> None:
        self.index = index
        self.argued = False  # some non-blank argument text was sent
        self.start_input = start_input


class AnthropicStreamParser(TypedEventParser):
    """The events of one streamed response -> chunks; ``run`` returns the completing chunk."""

    end_marker = "message_stop or a stop reason"
    wire_name = "the Anthropic"

    def __init__(self, url: str, redact: Any, max_event_bytes: int) -> None:
        super().__init__(url, redact, max_event_bytes)
        self._counts: Dict[str, int] = {}  # token counts so far, by the API's names
        self._tools: Dict[int, _ToolBlock] = {}  # content block index -> its tool call
        self._tool_count = 0

    def plain_error(self, text: str) -> Dict[str, Any]:
        return {"type": "error", "error": {"type": None, "message": text}}

    # -- one event ---------------------------------------------------------------------

    def chunk_of(self, name: str, frame: Dict[str, Any]) -> Optional[Chunk]:
        kind = frame.get("type") if isinstance(frame.get("type"), str) else name
        if kind == "content_block_delta":
            return self._delta(frame)
        if kind == "content_block_start":
            return self._block_start(frame)
        if kind == "content_block_stop":
            return self._block_stop(frame)
        if kind == "message_start":
            return self._message_start(frame)
        if kind == "message_delta":
            delta = frame.get("delta") if isinstance(frame.get("delta"), dict) else {}
            self.finish_reason = finish_reason(delta.get("stop_reason")) or self.finish_reason
            self.usage = usage_of(merge_usage(self._counts, frame.get("usage")))
        elif kind == "message_stop":
            self.ended = True
        elif kind == "error" or name == "error":
            raise error_from_payload(frame, f"{self.url} sent an error in the stream after {self.events - 1} "
                                            f"events", self.redact)
        return None  # ping, and event types this client does not know yet

    def _message_start(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        message = frame.get("message") if isinstance(frame.get("message"), dict) else {}
        if isinstance(message.get("model"), str) and message["model"]:
            self.model = message["model"]
        self.usage = usage_of(merge_usage(self._counts, message.get("usage")))
        message_id = message.get("id")
        return Chunk(response_id=message_id) if isinstance(message_id, str) and message_id else None

    def _block_start(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        block = frame.get("content_block")
        index = frame.get("index")
        if not isinstance(block, dict) or not _is_index(index):
            return None
        kind = block.get("type")
        if kind == "text":
            return _text_chunk(block.get("text"), None)
        if kind == "thinking":
            return _text_chunk(None, block.get("thinking"))
        if kind != "tool_use":
            return None
        tool = self._tools[index] = _ToolBlock(self._tool_count, block.get("input"))
        self._tool_count += 1
        call_id, name = block.get("id"), block.get("name")
        return Chunk(tool_calls=(ToolCallDelta(tool.index, call_id if isinstance(call_id, str) and call_id else None,
                                               name if isinstance(name, str) and name else None),))

    def _delta(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        delta = frame.get("delta")
        if not isinstance(delta, dict):
            return None
        kind = delta.get("type")
        if kind == "text_delta":
            return _text_chunk(delta.get("text"), None)
        if kind == "thinking_delta":
            return _text_chunk(None, delta.get("thinking"))
        if kind != "input_json_delta":
            return None  # signature_delta, citations_delta...: nothing the caller reads
        tool = self._tool_at(frame)
        fragment = delta.get("partial_json")
        if tool is None or not isinstance(fragment, str) or not fragment:
            return None
        tool.argued = tool.argued or bool(fragment.strip())
        return Chunk(tool_calls=(ToolCallDelta(tool.index, arguments_fragment=fragment),))

    def _tool_at(self, frame: Dict[str, Any]) -> Optional[_ToolBlock]:
        index = frame.get("index")
        return self._tools.get(index) if _is_index(index) else None

    def _block_stop(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        tool = self._tool_at(frame)
        if tool is None:
            return None
        del self._tools[frame["index"]]
        deltas = []
        if not tool.argued:  # no input streamed: the call's input is the one it started with
            start = tool.start_input if isinstance(tool.start_input, dict) else {}
            deltas.append(ToolCallDelta(tool.index, arguments_fragment=json.dumps(start)))
        deltas.append(ToolCallDelta(tool.index + 1))  # opens the next index: closes this call now
        return Chunk(tool_calls=tuple(deltas))


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_chunk(content: Any, reasoning: Any) -> Optional[Chunk]:
    content = content if isinstance(content, str) and content else None
    reasoning = reasoning if isinstance(reasoning, str) and reasoning else None
    if reasoning is None:
        return None if content is None else text_chunk(content, None)  # a text delta: nearly every event
    return Chunk(content=content, reasoning=reasoning)
