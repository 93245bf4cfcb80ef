"""Putting a streamed answer back together: tool-call deltas and whole responses.

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
the calls that became complete with that delta: the old call when its index
is reused with a new id, and open lower-index calls once a higher index has
started **and** their arguments already parse as JSON.  The JSON check makes
early dispatch safe with interleaved streams: a call whose arguments are still
incomplete stays open until it completes or :meth:`finish` is called.
"""
from __future__ import annotations

import json
import uuid
from typing import Dict, List, Optional, Tuple

from ._messages import Chunk, Response, ToolCall, ToolCallDelta, Usage, too_deep


class _PartialCall:
    """One tool call being assembled; ``order`` is when its first fragment arrived."""

    __slots__ = ("index", "id", "name", "fragments", "order", "dirty")

    def __init__(self, index: int, order: int) -> None:
        self.index = index
        self.id: Optional[str] = None
        self.name: Optional[str] = None
        self.fragments: List[str] = []
        self.order = order
        self.dirty = True  # arguments changed since the last completeness check

    def merge(self, delta: ToolCallDelta) -> None:
        # First value wins: providers that repeat id/name on each fragment must
        # not produce "call_1call_1" or "searchsearch".
        if delta.id and self.id is None:
            self.id = delta.id
        if delta.name and self.name is None:
            self.name = delta.name
        if delta.arguments_fragment:
            self.fragments.append(delta.arguments_fragment)
            self.dirty = True

    def arguments(self) -> str:
        return "".join(self.fragments)

    def looks_complete(self) -> bool:
        """Named and with arguments that parse: nothing more can legally be appended."""
        if self.name is None or not self.dirty:
            return False
        self.dirty = False
        text = self.arguments().strip()
        # Cheap pre-checks before json.loads: a JSON object must end with "}";
        # arguments nested too deep can never be run (ToolCall.args refuses them,
        # and json would recurse to the interpreter's limit): finish() reports them.
        if not text.endswith("}") or too_deep(text):
            return False
        try:
            json.loads(text)
        except (ValueError, RecursionError):
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
    never sends, since its JSON was complete) are ignored.
    """

    def __init__(self) -> None:
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
        partial.merge(delta)
        if index > self._highest_index:
            self._highest_index = index
        if len(self._open) > 1:
            completed.extend(self._complete_lower(index))
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
    """Folds chunks into one :class:`Response`.

    Content (and reasoning, and refusal) pieces are joined; tool-call deltas go through a
    :class:`ToolCallAccumulator`; ``usage``, ``model`` and ``finish_reason`` are
    the last non-null values seen (providers send usage in a trailing frame).
    :meth:`add` is on the per-token path, so it does as little as it can.
    """

    def __init__(self) -> None:
        self._content = TextBuffer()
        self._content_parts = self._content.parts  # add() appends here directly: one call less a token
        self._reasoning = TextBuffer()
        self._refusal = TextBuffer()
        self.tools = ToolCallAccumulator()
        self.usage: Optional[Usage] = None
        self.model: Optional[str] = None
        self.finish_reason: Optional[str] = None
        self.completed = False
        self.chunks = 0

    def add(self, chunk: Chunk) -> List[ToolCall]:
        """Take one chunk; return tool calls that became complete (see ``ToolCallAccumulator.add``)."""
        self.chunks += 1
        content = chunk.content
        if content:
            parts = self._content_parts
            parts.append(content)
            if len(parts) >= BLOCK:
                self._content.compact()
        if chunk.reasoning:
            self._reasoning.append(chunk.reasoning)
        if chunk.refusal:
            self._refusal.append(chunk.refusal)
        if chunk.usage is not None:
            self.usage = chunk.usage
        model = chunk.model
        if model:
            self.model = model
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        if chunk.is_completed:
            self.completed = True
        if not chunk.tool_calls:
            return []
        completed: List[ToolCall] = []
        for delta in chunk.tool_calls:
            completed.extend(self.tools.add(delta))
        return completed

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
        )
