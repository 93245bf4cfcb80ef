"""Responses stream events -> :class:`Chunk`, with the completion rule and error mapping.

A streamed response is ``response.created``, ``response.in_progress``, then
per output item ``response.output_item.added``, its deltas and
``response.output_item.done``, and at the end ``response.completed`` (or
``response.incomplete``); ``response.failed`` and ``error`` end it badly.

* ``output_text.delta`` is content; ``reasoning_summary_text.delta`` and
  ``reasoning_text.delta`` (vLLM, Ollama) are reasoning; ``refusal.delta``
  is the refusal (``Chunk.refusal``: model output, not the answer).  Structural events
  (``created``, ``in_progress``, ``content_part.*``, ``*.done`` texts) yield
  nothing, so they never reset the idle timer -- nor do SSE comments;
* a ``function_call`` item is one native call.  Its ToolCallDelta index is
  its position among the calls (0, 1, ...); its id is the item's
  ``call_id`` (the ``fc_...`` item id is not what a ``function_call_output``
  answers), its name comes with ``output_item.added``, its arguments with
  each ``function_call_arguments.delta`` keyed by the item.  A server that
  sends no deltas (LM Studio) gives them whole in ``arguments.done`` or
  ``output_item.done``;
* a call is complete at its ``output_item.done``: as in the Anthropic
  parser, the arguments are completed and an empty delta opens the next
  index, which makes the engine's accumulator close (and the engine
  dispatch) the call then, not at ``response.completed``;
* hosted tools (web search, file search, code interpreter, image
  generation, MCP) stream only progress events: each is a chunk with
  nothing in it that still counts as the model working (``is_meaningful``);
* the answer is complete at ``response.completed`` or
  ``response.incomplete`` (whose reason is the finish reason: ``length``,
  ``content_filter``); both carry the usage.  Any other end is a broken
  stream.  ``event:`` lines are optional (OpenRouter and older OpenAI
  streams send none; the ``type`` field says it all), as is
  ``sequence_number``;
* the response's id (``response.id`` of ``response.created``, or of the
  final event) goes out once, on a chunk with nothing else in it.
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..._messages import Chunk, ToolCallDelta
from ..http.typed_events import TypedEventParser
from .answer import call_of, finish_reason_of, output_of, raise_error, usage_of

# Hosted tools' progress: response.web_search_call.searching, response.code_interpreter_call_code.delta...
_HOSTED_PROGRESS = re.compile(r"response\.(?!function_call_arguments\.)(?:\w+_call(?:_\w+)?|mcp_list_tools)\.\w+")
_HOSTED_ITEM = re.compile(r"\w+_call|mcp_list_tools")
_REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})


class ProgressChunk(Chunk):
    """Nothing to show, yet the provider is working (a hosted tool's progress): resets the idle timer."""

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["is_meaningful"] = True


_PROGRESS = ProgressChunk()


class _Call:
    __slots__ = ("argued", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.argued = False  # some argument text was sent


class ResponsesStreamParser(TypedEventParser):
    """The events of one streamed response -> chunks; ``run`` returns the completing chunk."""

    end_marker = "response.completed or response.incomplete"
    wire_name = "the Responses"

    def __init__(self, url: str, redact: Any, max_event_bytes: int) -> None:
        super().__init__(url, redact, max_event_bytes)
        self._calls: Dict[Any, _Call] = {}  # item id and ("output", index) -> its call
        self._call_count = 0
        self._shown = False  # text or a call was streamed (else response.completed's output is the answer)
        self._response_id: Optional[str] = None  # the id told so far

    def plain_error(self, text: str) -> Dict[str, Any]:
        return {"type": "error", "message": text}

    # -- one event ---------------------------------------------------------------------

    def chunk_of(self, name: str, frame: Dict[str, Any]) -> Optional[Chunk]:
        kind = frame.get("type") if isinstance(frame.get("type"), str) else name
        if kind == "response.output_text.delta":
            return self._text(frame.get("delta"), None)
        if kind in _REASONING_DELTAS:
            return self._text(None, frame.get("delta"))
        if kind == "response.refusal.delta":
            return self._refusal(frame.get("delta"))
        if kind == "response.function_call_arguments.delta":
            return self._arguments(frame, frame.get("delta"), whole=False)
        if kind == "response.function_call_arguments.done":
            return self._arguments(frame, frame.get("arguments"), whole=True)
        if kind == "response.output_item.added":
            return self._item_added(frame)
        if kind == "response.output_item.done":
            return self._item_done(frame)
        if kind in _LIFECYCLE:
            return self._note_response(frame.get("response"))
        if kind in ("response.completed", "response.incomplete"):
            told = self._note_response(frame.get("response"))
            return self._finished(frame.get("response"), incomplete=kind == "response.incomplete") or told
        if kind == "response.failed":
            response = frame.get("response") if isinstance(frame.get("response"), Mapping) else {}
            raise_error(response.get("error") or {"message": "the response failed"}, self.url, self.redact,
                        after=self.events - 1)
        if kind == "error" or name == "error":
            raise_error(frame, self.url, self.redact, after=self.events - 1)
        if _HOSTED_PROGRESS.fullmatch(kind):
            return _PROGRESS
        return None  # content_part.*, *.done texts, keep-alives, event types this client does not know yet

    def _text(self, content: Any, reasoning: Any) -> Optional[Chunk]:
        content = content if isinstance(content, str) and content else None
        reasoning = reasoning if isinstance(reasoning, str) and reasoning else None
        if content is None and reasoning is None:
            return None
        self._shown = self._shown or content is not None
        return Chunk(content=content, reasoning=reasoning)

    def _refusal(self, text: Any) -> Optional[Chunk]:
        if not isinstance(text, str) or not text:
            return None
        self._shown = True
        return Chunk(refusal=text)

    def _note_response(self, response: Any) -> Optional[Chunk]:
        """Note the response's model; a chunk with its id the first time that id is seen, else None."""
        if not isinstance(response, Mapping):
            return None
        if isinstance(response.get("model"), str) and response["model"]:
            self.model = response["model"]
        response_id = response.get("id")
        if not isinstance(response_id, str) or not response_id or response_id == self._response_id:
            return None
        self._response_id = response_id
        return Chunk(response_id=response_id)

    # -- function calls ----------------------------------------------------------------

    def _item_added(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        item = frame.get("item")
        if not isinstance(item, Mapping):
            return None
        kind = item.get("type")
        if kind == "function_call":
            call, deltas = self._start(frame, item)
            arguments = item.get("arguments")
            if isinstance(arguments, str) and arguments:
                call.argued = True
                deltas[0] = ToolCallDelta(call.index, deltas[0].id, deltas[0].name, arguments)
            return Chunk(tool_calls=tuple(deltas))
        if isinstance(kind, str) and _HOSTED_ITEM.fullmatch(kind):
            return _PROGRESS
        return None

    def _start(self, frame: Mapping[str, Any], item: Mapping[str, Any]) -> Tuple[_Call, List[ToolCallDelta]]:
        """A new call for a ``function_call`` item, findable by its item id and output index."""
        call = _Call(self._call_count)
        self._call_count += 1
        self._shown = True
        if isinstance(item.get("id"), str):
            self._calls[item["id"]] = call
        if _is_index(frame.get("output_index")):
            self._calls[("output", frame["output_index"])] = call
        found = call_of(item, call.index)
        name = found.name or None
        call_id = found.id if item.get("call_id") or item.get("id") else None
        return call, [ToolCallDelta(call.index, call_id, name)]

    def _call_at(self, frame: Mapping[str, Any]) -> Optional[_Call]:
        item_id = frame.get("item_id")
        if isinstance(item_id, str) and item_id in self._calls:
            return self._calls[item_id]
        index = frame.get("output_index")
        return self._calls.get(("output", index)) if _is_index(index) else None

    def _arguments(self, frame: Mapping[str, Any], text: Any, whole: bool) -> Optional[Chunk]:
        call = self._call_at(frame)
        if call is None or not isinstance(text, str) or not text or (whole and call.argued):
            return None
        call.argued = True
        return Chunk(tool_calls=(ToolCallDelta(call.index, arguments_fragment=text),))

    def _item_done(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        item = frame.get("item")
        if not isinstance(item, Mapping):
            return None
        kind = item.get("type")
        if kind != "function_call":
            return _PROGRESS if isinstance(kind, str) and _HOSTED_ITEM.fullmatch(kind) else None
        call = self._call_at({"item_id": item.get("id"), "output_index": frame.get("output_index")})
        deltas: List[ToolCallDelta] = []
        if call is None:  # a server that announces the call only when it is done
            call, deltas = self._start(frame, item)
        self._forget(call)
        if not call.argued:  # no arguments streamed: the item's own, or none
            arguments = item.get("arguments")
            text = arguments if isinstance(arguments, str) and arguments else (
                json.dumps(arguments) if isinstance(arguments, dict) else "{}")
            deltas.append(ToolCallDelta(call.index, arguments_fragment=text))
        deltas.append(ToolCallDelta(call.index + 1))  # opens the next index: closes this call now
        return Chunk(tool_calls=tuple(deltas))

    def _forget(self, call: _Call) -> None:
        for key in [key for key, known in self._calls.items() if known is call]:
            del self._calls[key]

    # -- the end -----------------------------------------------------------------------

    def _finished(self, response: Any, incomplete: bool) -> Optional[Chunk]:
        response = response if isinstance(response, Mapping) else {}
        self.usage = usage_of(response.get("usage")) or self.usage
        self.ended = True
        output = response.get("output")
        if self._shown or not isinstance(output, list):
            self.finish_reason = finish_reason_of(response, self._call_count > 0, incomplete)
            return None
        # Nothing was streamed: a server that sends the answer only in the final object.
        found = output_of(output)
        self.finish_reason = finish_reason_of(response, bool(found.calls), incomplete)
        deltas = tuple(ToolCallDelta(i, call.id, call.name, call.arguments) for i, call in enumerate(found.calls))
        if not (found.text or deltas or found.refusal):
            return None
        return Chunk(content=found.text or None, tool_calls=deltas, refusal=found.refusal or None,
                     response_id=self._response_id)


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
