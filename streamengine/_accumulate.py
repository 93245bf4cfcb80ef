"""Putting a streamed answer back together: tool-call deltas, JSON argument shapes, whole responses.

Whether streamed JSON arguments can be complete yet, followed fragment by fragment.

Interleaved tool calls are checked for completeness after every fragment of
another call; joining and parsing the whole text each time made two
interleaved streams cost quadratic time.  :class:`JsonShape` follows the
brackets and strings of each fragment once (a regex skips the plain text),
so only an object whose outer brace has closed is ever parsed.

Putting a streamed answer back together: tool-call deltas and whole responses.

Providers stream a native tool call as fragments keyed by ``index``: the
first fragment usually carries ``id`` and ``name``, later ones only pieces of
the ``arguments`` JSON.  Real providers bend this in ways seen in the wild:

* the id and name are repeated on every fragment — so they are **set once,
  never concatenated**;
* an index is reused for a second call with a new id — so a different id on
  a known index **starts a new call** (and completes the old one);
* argument fragments arrive before the name — so they are **held** and the
  call only counts once it has a name;
* parallel calls are interleaved by index.

The engine wants to start a tool as soon as its call is complete, not when
the stream ends ("early dispatch").  :meth:`ToolCallAccumulator.add` returns
the calls that became complete with that delta: a call whose delta says
``done`` (a wire that marks the end of each call says so itself), the old
call when its index is reused with a new id, and open lower-index calls once
a higher index has started **and** their arguments already parse as JSON.  The JSON check makes
early dispatch safe with interleaved streams: a call whose arguments are still
incomplete stays open until it completes or :meth:`finish` is called.

What a provider sends is bounded here, while it accumulates (``_config.OutputLimits``):
the answer, reasoning and refusal text of one call and the arguments of each
tool call; crossing a cap raises :class:`LlmOutputLimitError` before the
chunk is kept.  Whether interleaved arguments are complete is followed
fragment by fragment (``JsonShape``), so two interleaved calls cost
time linear in their bytes: the whole text is parsed once, when its outer
object has closed.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Dict, List, Optional, Tuple

from ._config import OutputLimits, check_length, output_limit_error
from ._messages import (
    MAX_ARGUMENT_CHARS,
    MAX_ARGUMENT_DEPTH,
    Chunk,
    ProviderItem,
    Response,
    ToolCall,
    ToolCallDelta,
    Usage,
)

_OUTSIDE_STRING = re.compile(r'[{}\[\]"]')
_INSIDE_STRING = re.compile(r'["\\]')


class JsonShape:
    """Follows a JSON object's brackets and strings across fragments, in time linear in its text.

    ``ended``: the outer object closed (only then can the text parse);
    ``broken``: it cannot become one JSON object any more (does not start with
    ``{``, text after the close, or it failed to parse once).  ``depth_max``
    is what :func:`too_deep` would find.
    """

    __slots__ = ("begun", "broken", "depth", "depth_max", "ended", "escaped", "in_string")

    def __init__(self) -> None:
        self.begun = self.in_string = self.escaped = self.ended = self.broken = False
        self.depth = self.depth_max = 0

    def feed(self, text: str) -> None:
        if self.broken:
            return
        if self.ended or not self.begun:
            stripped = text.lstrip()
            if not stripped:
                return
            if self.ended or stripped[0] != "{":
                self.broken = True
                return
            self.begun = True
        self._scan(text)

    def _scan(self, text: str) -> None:
        pos, end = 0, len(text)
        if self.escaped:  # the previous fragment ended inside a string on a backslash
            self.escaped, pos = False, 1
        while pos < end:
            if self.in_string:
                match = _INSIDE_STRING.search(text, pos)
                if match is None:
                    return
                pos = match.end()
                if match.group() == '"':
                    self.in_string = False
                elif pos >= end:
                    self.escaped = True
                else:
                    pos += 1  # the escaped character
                continue
            match = _OUTSIDE_STRING.search(text, pos)
            if match is None:
                return
            pos, char = match.end(), match.group()
            if char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
                self.depth_max = max(self.depth_max, self.depth)
            else:
                self.depth -= 1
                if self.depth <= 0:
                    self.ended = True
                    self.broken = self.depth < 0 or bool(text[pos:].strip())
                    return


class _PartialCall:
    """One tool call being assembled; ``order`` is when its first fragment arrived."""

    __slots__ = ("chars", "dirty", "fragments", "id", "index", "name", "order", "shape")

    def __init__(self, index: int, order: int) -> None:
        self.index = index
        self.id: Optional[str] = None
        self.name: Optional[str] = None
        self.fragments = TextBuffer()
        self.chars = 0
        self.shape = JsonShape()
        self.order = order
        self.dirty = True  # arguments changed since the last completeness check

    def merge(self, delta: ToolCallDelta, limit: int) -> None:
        # First value wins: providers that repeat id/name on each fragment must
        # not produce "call_1call_1" or "searchsearch".
        if delta.id and self.id is None:
            self.id = delta.id
        if delta.name and self.name is None:
            self.name = delta.name
        fragment = delta.arguments_fragment
        if fragment:
            self.chars += len(fragment)
            if self.chars > limit:
                raise output_limit_error("tool arguments", limit, "EngineConfig.max_tool_argument_chars")
            self.fragments.append(fragment)
            self.shape.feed(fragment)
            self.dirty = True

    def arguments(self) -> str:
        return self.fragments.text()

    def looks_complete(self) -> bool:
        """Named and with arguments that parse: nothing more can legally be appended.

        The text is joined and parsed only once its outer object has closed
        (``JsonShape``), and at most once: after that it either completes or
        can never be complete.  Arguments nested too deep can never be run
        (``ToolCall.args`` refuses them): ``finish()`` reports them.
        """
        if self.name is None or not self.dirty:
            return False
        self.dirty = False
        shape = self.shape
        if not shape.ended or shape.broken or shape.depth_max > MAX_ARGUMENT_DEPTH:
            return False
        try:
            json.loads(self.arguments())
        except (ValueError, RecursionError):
            shape.broken = True
            return False
        return True

    def to_call(self) -> ToolCall:
        text = self.arguments()
        return ToolCall(
            id=self.id or f"call_{uuid.uuid4().hex[:16]}",
            name=self.name or "",
            arguments=text if text.strip() else "{}",
        )


class ToolCallAccumulator:
    """Assembles streamed :class:`ToolCallDelta` fragments into :class:`ToolCall` objects.

    ``add(delta)`` returns calls completed early (see the module docstring);
    ``finish()`` returns every call still open at the end of the stream.
    Each call is returned exactly once across all ``add``/``finish`` calls;
    :attr:`calls` lists them all, in the order their first fragment arrived.
    A call that never received a name cannot be run; ``finish`` drops it.
    Fragments for a call already returned early (which a well-formed stream
    never sends, since its JSON was complete) are ignored.  A call whose
    arguments pass ``max_argument_chars`` raises :class:`LlmOutputLimitError`.
    """

    def __init__(self, max_argument_chars: int = MAX_ARGUMENT_CHARS) -> None:
        self._max_argument_chars = max_argument_chars
        self._open: Dict[int, _PartialCall] = {}
        self._done: List[Tuple[int, ToolCall]] = []  # (order, call)
        self._closed: Dict[int, str] = {}  # index -> id of a call returned early
        self._next_order = 0
        self._highest_index = -1

    def add(self, delta: ToolCallDelta) -> List[ToolCall]:
        """Take one fragment; return the calls that this fragment proved complete."""
        completed: List[ToolCall] = []
        index = delta.index
        partial = self._open.get(index)
        if partial is not None and delta.id and partial.id is not None and delta.id != partial.id:
            # Same index, new id: the provider reused the slot for the next call.
            completed.extend(self._close(index))
            partial = None
        if partial is None:
            if self._is_late(index, delta):
                return completed
            partial = self._open[index] = _PartialCall(index, self._next_order)
            self._next_order += 1
        partial.merge(delta, self._max_argument_chars)
        if index > self._highest_index:
            self._highest_index = index
        if len(self._open) > 1:
            completed.extend(self._complete_lower(index))
        if delta.done:
            completed.extend(self._close(index, early=True))
        return completed

    def _is_late(self, index: int, delta: ToolCallDelta) -> bool:
        """A fragment for a call already returned early (same or no id)."""
        closed_id = self._closed.get(index)
        if closed_id is None:
            return False
        if delta.id and delta.id != closed_id:
            del self._closed[index]  # a genuinely new call on that index
            return False
        return True

    def _complete_lower(self, index: int) -> List[ToolCall]:
        ready = [i for i, p in self._open.items() if i < index and p.looks_complete()]
        out: List[ToolCall] = []
        for i in sorted(ready):
            out.extend(self._close(i, early=True))
        return out

    def _close(self, index: int, early: bool = False) -> List[ToolCall]:
        partial = self._open.pop(index)
        if partial.name is None:
            return []
        call = partial.to_call()
        self._done.append((partial.order, call))
        if early:
            self._closed[index] = call.id
        return [call]

    def finish(self) -> List[ToolCall]:
        """Close every open call (in index order) and return those not returned yet."""
        out: List[ToolCall] = []
        for index in sorted(self._open):
            out.extend(self._close(index))
        return out

    @property
    def calls(self) -> Tuple[ToolCall, ...]:
        """Every call returned so far, in the order the calls started."""
        return tuple(call for _, call in sorted(self._done, key=lambda pair: pair[0]))

    @property
    def pending(self) -> int:
        """How many calls are still open."""
        return len(self._open)


class TextBuffer:
    """Text pieces to be joined at the end, in memory proportional to the text.

    A list with one reference per token costs 8 bytes a token on top of the
    text (and keeps every small token string alive): 16 MB for a 1M-token
    answer of 1 MB.  Every ``BLOCK`` pieces are joined into one string, so
    the overhead is one reference per block; each character is copied twice.
    """

    __slots__ = ("blocks", "parts")

    def __init__(self) -> None:
        self.blocks: List[str] = []
        self.parts: List[str] = []

    def append(self, text: str) -> None:
        parts = self.parts
        parts.append(text)
        if len(parts) >= BLOCK:
            self.compact()

    def compact(self) -> None:
        """Join the pending pieces into one block (hot callers append to ``parts`` themselves)."""
        if self.parts:
            self.blocks.append("".join(self.parts))
            self.parts.clear()

    def __bool__(self) -> bool:
        return bool(self.parts) or bool(self.blocks)

    def text(self) -> str:
        if self.blocks:
            return "".join(self.blocks) + "".join(self.parts)
        return "".join(self.parts)


#: Pieces per joined block; ``parts`` never holds more.  ``parts`` is one list for
#: the buffer's life, so a caller may keep a reference and append to it directly.
BLOCK = 1024


class ResponseAggregator:
    """Folds chunks into one :class:`Response`, within ``limits`` (:class:`OutputLimits`).

    Content (and reasoning, and refusal) pieces are joined; tool-call deltas go through a
    :class:`ToolCallAccumulator`; ``usage``, ``model``, ``finish_reason`` and
    the response's id are the last non-null values seen (providers send usage in a trailing frame).
    A chunk that takes a text past its cap raises :class:`LlmOutputLimitError`
    and is not kept.  :meth:`add` is on the per-token path, so it does as little as it can.
    """

    def __init__(self, limits: Optional[OutputLimits] = None) -> None:
        limits = limits if limits is not None else OutputLimits()
        self.limits = limits
        self._content = TextBuffer()
        self._content_parts = self._content.parts  # add() appends here directly: one call less a token
        self._content_left = limits.answer_chars
        self._reasoning = TextBuffer()
        self._reasoning_chars = 0
        self._refusal = TextBuffer()
        self._refusal_chars = 0
        self._items: List[ProviderItem] = []
        self._items_chars = 0
        self.tools = ToolCallAccumulator(limits.tool_argument_chars)
        self.usage: Optional[Usage] = None
        self.model: Optional[str] = None
        self.finish_reason: Optional[str] = None
        self.response_id: Optional[str] = None
        self.completed = False
        self.chunks = 0

    def add(self, chunk: Chunk) -> List[ToolCall]:
        """Take one chunk; return tool calls that became complete (see ``ToolCallAccumulator.add``).

        A chunk of answer text only (``Chunk.text_only``: nearly every one) is
        done after its text and model; the other fields are looked at otherwise.
        """
        self.chunks += 1
        content = chunk.content
        if content:
            self._content_left -= len(content)
            if self._content_left < 0:
                raise output_limit_error("answer", self.limits.answer_chars, "EngineConfig.max_answer_chars")
            parts = self._content_parts
            parts.append(content)
            if len(parts) >= BLOCK:
                self._content.compact()
        model = chunk.model
        if model:
            self.model = model
        if chunk.text_only:
            return []
        if chunk.reasoning or chunk.refusal or chunk.provider_items:
            self._add_aside(chunk)
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        if chunk.response_id:
            self.response_id = chunk.response_id
        if chunk.is_completed:
            self.completed = True
        if not chunk.tool_calls:
            return []
        completed: List[ToolCall] = []
        for delta in chunk.tool_calls:
            completed.extend(self.tools.add(delta))
        return completed

    def _add_aside(self, chunk: Chunk) -> None:
        """Reasoning, refusal text and provider items: kept apart from the answer, each within its cap."""
        if chunk.reasoning:
            self._reasoning_chars += len(chunk.reasoning)
            check_length("reasoning", self._reasoning_chars, self.limits.reasoning_chars,
                         "EngineConfig.max_reasoning_chars")
            self._reasoning.append(chunk.reasoning)
        if chunk.refusal:
            self._refusal_chars += len(chunk.refusal)
            check_length("refusal", self._refusal_chars, self.limits.answer_chars, "EngineConfig.max_answer_chars")
            self._refusal.append(chunk.refusal)
        for item in chunk.provider_items:
            self._items_chars += item.size
            check_length("reasoning items", self._items_chars, self.limits.reasoning_chars,
                         "EngineConfig.max_reasoning_chars")
            self._items.append(item)

    @property
    def content(self) -> str:
        return self._content.text()

    @property
    def reasoning(self) -> str:
        return self._reasoning.text()

    def finish(self) -> List[ToolCall]:
        """Close open tool calls; returns those not returned by :meth:`add` yet."""
        return self.tools.finish()

    def response(self) -> Response:
        """The aggregated response; closes any tool call still open."""
        self.tools.finish()
        return Response(
            content=self.content,
            tool_calls=self.tools.calls,
            usage=self.usage,
            model=self.model,
            finish_reason=self.finish_reason,
            refusal=self._refusal.text() or None,
            reasoning=self.reasoning or None,
            id=self.response_id,
            provider_items=tuple(self._items),
        )
