"""OpenAI chat-completion frames and answers -> Chunks and Responses.

Providers differ in the details, so parsing is lenient where it costs nothing
(a null or ``"0"`` choice index, arguments sent as an object, text sent as a
list of parts) and strict where a wrong guess would lose or invent an answer:
a stream is complete only with ``[DONE]`` or a finish reason -- a
close-delimited body cut mid-stream looks like a clean end -- and a frame that
is not a JSON object is a protocol error.
"""
from __future__ import annotations

import json
import math
import threading
from typing import Any, Dict, Generator, List, Optional, Tuple

import requests

from ..._errors import LlmProtocolError
from ..._messages import Chunk, Response, ToolCall, ToolCallDelta, Usage, text_chunk
from ..http.connection import RequestTracker
from ..http.sse_read import WAIT
from ..http.transport import SseStreamParser
from .errors import raise_in_band_error

_scan_json = json.JSONDecoder().scan_once  # (obj, end) from a str and an index, in C


class StreamParser(SseStreamParser):
    """SSE events of one response -> Chunks, with the completion rule and error mapping."""

    end_marker = "a finish reason or [DONE]"

    def run(self, resp: requests.Response, cancel: Optional[threading.Event],
            tracker: RequestTracker) -> Generator[Chunk, None, Chunk]:
        # The per-event loop is the hot path (100k+ events/s): names are bound
        # to locals, and a plain ``data:`` JSON object without "error" goes
        # straight to _chunk_from_frame.
        chunk_of, from_frame, scan = self._chunk, self._chunk_from_frame, _scan_json
        with self.reading(resp, cancel, tracker) as (events, flag):
            for name, data in events:
                if name is WAIT:  # the body would block: the run waits for it, with everything else
                    yield data
                    continue
                if flag.cancelled:
                    break
                self.events += 1
                if data == "[DONE]":
                    self.ended = True
                    return self.completed()
                try:
                    frame, end = scan(data, 0)
                except (StopIteration, ValueError):
                    end = -1
                if end == len(data) and name == "message" and type(frame) is dict and "error" not in frame:
                    yield from_frame(frame)
                    continue
                chunk = chunk_of(name, data)
                if chunk is not None:
                    yield chunk
        return self.unfinished(cancel, tracker)

    def _chunk(self, event_name: str, data: str) -> Optional[Chunk]:
        if event_name == "ping":
            return None
        try:
            # The C scanner json.loads ends in, without its three Python frames;
            # anything unusual (whitespace around, trailing data, an error)
            # goes through json.loads for its exact result or message.
            frame, end = _scan_json(data, 0)
            if end != len(data):
                frame = json.loads(data)
        except (StopIteration, ValueError):
            try:
                frame = json.loads(data)
            except ValueError as exc:
                if event_name == "error":
                    frame = {"error": {"message": data}}
                else:
                    raise LlmProtocolError(
                        f"{self.url} sent a stream frame that is not JSON ({exc}): "
                        f"{self.redact(data[:200])!r}; the provider does not speak the OpenAI stream format"
                    ) from exc
        if type(frame) is not dict:
            raise LlmProtocolError(
                f"{self.url} sent a stream frame that is not a JSON object: {self.redact(data[:200])!r}"
            )
        if event_name == "error" and "error" not in frame:
            frame = {"error": frame}
        if frame.get("error"):
            raise_in_band_error(frame, self.url, self.redact, after=self.events - 1)
        return self._chunk_from_frame(frame)

    def _chunk_from_frame(self, frame: Dict[str, Any]) -> Chunk:
        """The Chunk of a JSON frame; the dominant shape directly, the same as :meth:`_chunk_of_any_frame`.

        That shape is a text delta: the first choice's index 0 (or none),
        a delta of only a non-empty string ``content``, no finish reason,
        no usage.  The subscripts succeed only on dicts and a list (json
        makes nothing else with them), so they are the type checks too.
        """
        try:
            choice = frame["choices"][0]
            delta = choice["delta"]
            content = delta["content"]
        except (KeyError, IndexError, TypeError):
            return self._chunk_of_any_frame(frame)
        index = choice.get("index", 0)
        if (len(delta) != 1 or type(content) is not str or not content or choice.get("finish_reason") is not None
                or index != 0 or type(index) is not int or frame.get("usage") is not None):
            return self._chunk_of_any_frame(frame)
        model = frame.get("model")
        if type(model) is str:
            self.model = model
        return text_chunk(content, self.model)

    def _chunk_of_any_frame(self, frame: Dict[str, Any]) -> Chunk:
        # Exact type checks are isinstance checks here: json makes exact types.  The answer's id is
        # read here, not in the text fast path: the role delta, the finish and the usage frames carry it too.
        get = frame.get
        model = get("model")
        if type(model) is str:
            self.model = model
        if self.response_id is None:
            response_id = get("id")
            if type(response_id) is str and response_id:
                self.response_id = response_id
        usage = get("usage")
        if usage is not None:
            usage = _usage(usage)
            if usage is not None:
                self.usage = usage
        choices = get("choices")
        choice = choices[0] if type(choices) is list and choices else None
        if type(choice) is dict:
            index = choice.get("index", 0)
            if index != 0 or type(index) is not int:
                choice = _first_choice(choices)
        else:
            choice = _first_choice(choices)
        delta = choice.get("delta")
        if type(delta) is not dict:
            delta = {}
        finish = choice.get("finish_reason")
        if finish and type(finish) is str:
            self.finish_reason = finish
        else:
            finish = None
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning is not None:
            reasoning = _text_or_none(reasoning)
        refusal = delta.get("refusal")
        if refusal is not None:
            refusal = _text_or_none(refusal)
        if type(content) is list:
            content, reasoning, refusal = _typed_parts(content, reasoning, refusal)
        elif type(content) is not str or not content:
            content = None
        tool_calls = delta.get("tool_calls")
        return Chunk(content, reasoning, () if tool_calls is None else _tool_call_deltas(tool_calls),
                     False, usage, finish, self.model, refusal)


def _text_or_none(value: Any) -> Optional[str]:
    """Text: a string, or the text of a list of parts (``[{"type": "text", "text": ...}]``).

    Anything else (a number, an object) is not text and is ignored.
    """
    if isinstance(value, str):
        return value or None
    if isinstance(value, list):
        return _typed_parts(value, None, None)[0]
    return None


#: Where each typed content part keeps its text, and what it is to the caller.
_PART_TEXT = {"text": ("text", 0), "output_text": ("text", 0), "thinking": ("thinking", 1),
              "reasoning": ("reasoning", 1), "refusal": ("refusal", 2)}


def _typed_parts(parts: List[Any], reasoning: Optional[str],
                 refusal: Optional[str]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """``(content, reasoning, refusal)`` of a list of typed parts, read as the provider means them.

    ``text`` parts are the answer; ``thinking`` parts are reasoning --
    Magistral sends ``{"type": "thinking", "thinking": [{"type": "text",
    "text": ...}]}`` -- and ``refusal`` parts (OpenAI) are a refusal.
    Reasoning or a refusal the delta already carries comes first.  A part of
    an unknown type is ignored: guessing would show internals as the answer.
    """
    found: List[List[str]] = [[], [reasoning] if reasoning else [], [refusal] if refusal else []]
    for part in parts:
        if not isinstance(part, dict):
            continue
        key, slot = _PART_TEXT.get(part.get("type", "text"), (None, 0))
        if key is None:
            continue
        value = part.get(key)
        text = value if isinstance(value, str) else (_text_or_none(value) if isinstance(value, list) else None)
        if text:
            found[slot].append(text)
    content, thought, refused = ("".join(texts) or None for texts in found)
    return content, thought, refused


def _choice_index(choice: Dict[str, Any]) -> Optional[int]:
    index = choice.get("index", 0)
    if index is None:
        return 0  # some servers send null for the only choice
    if isinstance(index, bool):
        return None
    if isinstance(index, int):
        return index
    if isinstance(index, str) and index.strip().isdigit():
        return int(index)
    return None


def _first_choice(choices: Any) -> Dict[str, Any]:
    """The choice with index 0 (``n > 1`` is not supported: other choices are ignored).

    A missing, null or ``"0"`` index counts as 0: dropping the only choice of
    a sloppy server would silently lose the answer.
    """
    if not isinstance(choices, list):
        return {}
    for choice in choices:
        if isinstance(choice, dict) and _choice_index(choice) == 0:
            return choice
    return {}


def _token_count(value: Any) -> Optional[int]:
    """A token count: a non-negative integer (``3.0`` accepted); anything else is unknown."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value < 1 << 53:
        return value
    return None


def _usage(raw: Any, prompt_key: str = "prompt_tokens", completion_key: str = "completion_tokens") -> Optional[Usage]:
    """Usage numbers; a frame with absurd ones (``1e400``, ``"x"``, ``-5``) carries no usage.

    The keys are Chat Completions'; the Responses wire passes its own
    (``input_tokens``, ``output_tokens``).  Both wires give the cached part
    of the prompt and the reasoning part of the completion in
    ``{key}_details`` (``prompt_tokens_details.cached_tokens``,
    ``input_tokens_details.cached_tokens``...); an absurd detail counts as 0.
    """
    if not isinstance(raw, dict):
        return None
    prompt = _token_count(raw.get(prompt_key) or 0)
    completion = _token_count(raw.get(completion_key) or 0)
    if prompt is None or completion is None:
        return None
    total = _token_count(raw.get("total_tokens") or (prompt + completion))
    if total is None:
        return None
    return Usage(prompt, completion, total, _detail(raw, f"{prompt_key}_details", "cached_tokens"),
                 _detail(raw, f"{completion_key}_details", "reasoning_tokens"))


def _detail(raw: Dict[str, Any], group: str, name: str) -> int:
    details = raw.get(group)
    return (_token_count(details.get(name) or 0) or 0) if isinstance(details, dict) else 0


def _arguments_text(raw: Any) -> Optional[str]:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    return json.dumps(raw)  # some servers send an object instead of JSON text


def _string_or_none(value: Any) -> Optional[str]:
    """Ids and names are strings; a number or a list there is garbage, not a name."""
    return value if isinstance(value, str) and value else None


def _tool_call_deltas(raw: Any) -> Tuple[ToolCallDelta, ...]:
    if not isinstance(raw, list):
        return ()
    deltas = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            continue
        raw_function = item.get("function")
        function: Dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        index = item.get("index", position)
        # Empty strings are "not sent": an empty id would look like a new call.
        call_id = _string_or_none(item.get("id"))
        name = _string_or_none(function.get("name"))
        arguments = _arguments_text(function.get("arguments")) or None
        if call_id is None and name is None and arguments is None:
            continue
        valid_index = isinstance(index, int) and not isinstance(index, bool)
        deltas.append(ToolCallDelta(index=index if valid_index else position,
                                    id=call_id, name=name, arguments_fragment=arguments))
    return tuple(deltas)



def response_from_json(payload: Any, redact: Any) -> Response:
    if not isinstance(payload, dict):
        raise LlmProtocolError(f"a chat completion must be a JSON object, got {redact(str(payload)[:200])!r}")
    choice = _first_choice(payload.get("choices"))
    message = choice.get("message") if isinstance(choice.get("message"), dict) else None
    if message is None:
        raise LlmProtocolError(
            f"the chat completion has no choices[0].message: {redact(json.dumps(payload)[:300])}; "
            f"the provider does not speak the OpenAI format"
        )
    calls = []
    for position, item in enumerate(message.get("tool_calls") or ()):
        if not isinstance(item, dict):
            continue
        raw_function = item.get("function")
        function: Dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        calls.append(ToolCall(id=_string_or_none(item.get("id")) or f"call_{position}",
                              name=_string_or_none(function.get("name")) or "",
                              arguments=_arguments_text(function.get("arguments")) or "{}"))
    finish = choice.get("finish_reason")
    raw_content = message.get("content")
    reasoning = _text_or_none(message.get("reasoning_content") or message.get("reasoning"))
    refusal = _text_or_none(message.get("refusal"))
    content: Optional[str] = raw_content if isinstance(raw_content, str) else None
    if isinstance(raw_content, list):
        content, reasoning, refusal = _typed_parts(raw_content, reasoning, refusal)
    return Response(
        content=content or "",
        reasoning=reasoning,
        refusal=refusal,
        tool_calls=tuple(calls),
        usage=_usage(payload.get("usage")),
        model=payload.get("model") if isinstance(payload.get("model"), str) else None,
        finish_reason=finish if isinstance(finish, str) else None,
        id=_string_or_none(payload.get("id")),
    )


def vectors_from_json(payload: Any, expected: int) -> List[List[float]]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        got = len(data) if isinstance(data, list) else "no"
        raise LlmProtocolError(
            f"the embeddings answer holds {got} vectors for {expected} inputs; "
            f"the provider does not speak the OpenAI embeddings format"
        )
    try:
        ordered = sorted(data, key=lambda item: int(item.get("index", 0)))
        return [[float(x) for x in item["embedding"]] for item in ordered]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise LlmProtocolError(
            f"the embeddings answer is malformed ({exc}); expected data[i].embedding lists") from exc
