"""Inline tool blocks: find ``<tool name="NAME">{JSON}</tool>`` in streamed text.

The model writes tool calls into its answer while it talks; this module finds
them as the text streams by, so the engine can start each tool the moment its
block closes.  It is a literal scanner plus a size-capped ``json.loads`` --
deliberately no XML library: model output is hostile input (a web page can
tell a model what to write), and XML parsers expand entities, follow DTDs and
recurse.  Here ``&lt;``, ``&#x41;``, ``<!DOCTYPE`` and ``<!ENTITY`` are just
characters.

What the scanner guarantees (the contract the engine and tests rely on):

* Every character fed comes out in ``FeedResult.visible`` exactly once, in
  order -- blocks included (a frontend renders them), broken blocks included.
  The concatenation of all ``visible`` texts, ``flush()`` included, equals the
  concatenation of all fed texts.
* Linear in the total input: every character is looked at a bounded number of
  times, whatever the split.  Scanner state (inside a JSON string, after a
  backslash, part of ``</tool>`` seen, inside a quoted attribute) is kept
  across ``feed`` calls instead of rescanning.
* Text is released at once, except (a) a tail of at most five characters that
  could still begin ``<tool`` + whitespace, and (b) an open block, which is
  held until it closes, is given up, or the stream ends.

The rules where a choice had to be made:

* Only the exact, lower-case ``<tool`` followed by a whitespace character
  (space, tab, CR, LF) opens a block.  ``<tool>``, ``<tools>``, ``<toolbox>``,
  ``<Tool ...>`` are plain text and not parse errors.
* ``<tool name="x"/>`` (self-closing) is a complete block with no body --
  otherwise it would swallow the rest of the answer while waiting for a
  ``</tool>`` that never comes.
* The body ends at the first ``</tool>`` (exact, lower-case) outside a JSON
  string; string state follows JSON escapes.  The start tag ends at the first
  ``>`` outside a quoted attribute value.
* A start tag may hold only name characters ``[A-Za-z0-9_.:-]``, whitespace,
  ``/``, ``=`` and quoted values (a quote opens a value only right after
  ``=``).  Any other character before its ``>`` -- a ``<``, an apostrophe or
  comma in prose -- shows it was a mention, not a block: the text so far is
  released at once (no block was formed, so no parse error) and scanning
  resumes at that character.  So ``the <tool element's name`` does not hold
  the answer back, and ``use <tool <tool name="search">{...}</tool>`` still
  finds the real call.  Malformed but tag-shaped attributes (``name=x``,
  ``a="1" a="2"``, ``9a="1"``) reach ``>`` and are parse errors.
* Which closed blocks are valid calls (attributes, names, the JSON body) is
  decided, and documented, in :mod:`streamengine._inline.block`.
* A block longer than ``max_block_chars`` (start tag + body + ``</tool>``) is
  given up as text the moment its next character would cross the cap, and
  **counts as a parse error** (the model tried to call a tool and failed).
  The scanner then continues in text mode right after the given-up text, so a
  late ``</tool>`` is plain text.  A block of exactly ``max_block_chars``
  characters is accepted.
* A block still open at ``flush()`` is released as text and is not a parse
  error (the stream was cut, the model did not write a bad block).
* Unknown tool names are still calls: the engine owns the allowlist.
* Call ids are ``id_prefix`` + a counter starting at 1, unique per scanner (use
  one scanner per request, or a per-round prefix, for ids unique per request).
  ``arguments`` is the canonical JSON text (sorted keys, compact separators,
  non-ASCII kept) so the engine can dedup on it.

A scanner is not thread-safe: one per stream, fed from one thread.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Tuple

from .. import _validation as validation
from .._errors import ConfigError
from .._messages import ToolCall
from .block import CLOSE as _CLOSE
from .block import OPEN as _OPEN
from .block import WS as _WS
from .block import BlockError, block_parts, parse_block, snippet

_MIN_BLOCK_CHARS = len('<tool name="x"></tool>')

_TEXT, _TAG, _BODY = 0, 1, 2

# One regex search per interesting character keeps the per-character work in C.
# In a start tag outside quotes: anything but name characters, whitespace and "/".
_TAG_SPECIAL = re.compile(r"[^A-Za-z0-9_.:\- \t\r\n/]")
_NON_WS = re.compile(r"[^ \t\r\n]")
_BODY_SPECIAL = re.compile(r'["<]')
_STRING_SPECIAL = re.compile(r'["\\]')


@dataclass(frozen=True)
class FeedResult:
    """What one ``feed``/``flush`` released: text to show, calls to start.

    ``errors`` gives the reason for each block that failed to parse in this
    step (in order), so the engine can tell without re-parsing.  ``rejected``
    pairs each closed block that failed with a :class:`ToolCall` naming it
    (name as written, or ``""``; the raw body as ``arguments``), so the model
    can be told in the continuation why its call did not run.  Blocks given
    up as too long, or left open at ``flush``, are in ``errors`` only.
    """

    visible: str
    calls: Tuple[ToolCall, ...] = ()
    errors: Tuple[str, ...] = ()
    rejected: Tuple[Tuple[ToolCall, str], ...] = ()

    # By hand, not generated: ``feed`` builds one per model token, and the
    # generated frozen __init__ pays an object.__setattr__ call per field.
    def __init__(self, visible: str, calls: Tuple[ToolCall, ...] = (), errors: Tuple[str, ...] = (),
                 rejected: Tuple[Tuple[ToolCall, str], ...] = ()) -> None:
        d = self.__dict__
        d["visible"] = visible
        d["calls"] = calls
        d["errors"] = errors
        d["rejected"] = rejected


_EMPTY = FeedResult("")


class InlineToolScanner:
    """Incremental scanner for inline tool blocks in a model's streamed text.

    Feed it each content delta in order; show ``visible`` to the user and start
    ``calls``.  Call ``flush()`` once when the stream ends.  See the module
    docstring for the exact rules.
    """

    def __init__(self, max_block_chars: int = 16384, id_prefix: str = "call_inline_",
                 max_json_depth: int = 64) -> None:
        validation.count(max_block_chars, f"max_block_chars (the smallest block has {_MIN_BLOCK_CHARS} characters)",
                         minimum=_MIN_BLOCK_CHARS)
        validation.count(max_json_depth, "max_json_depth", minimum=1)
        if not isinstance(id_prefix, str):
            raise ConfigError(f"id_prefix must be a string, got {type(id_prefix).__name__}")
        self.max_block_chars = max_block_chars
        self.id_prefix = id_prefix
        self.max_json_depth = max_json_depth
        self.parse_errors = 0
        self.calls_found = 0
        self._next_id = 1
        self._rejected: List[Tuple[ToolCall, str]] = []
        #: True in text mode with nothing held back: a piece without "<" is then visible
        #: as it is (``feed`` returns it whole, no call, no error), so a caller may skip ``feed``.
        self.plain = True
        self._mode = _TEXT
        self._held = ""
        self._reset_block()

    # ------------------------------------------------------------------ API

    def feed(self, text: str) -> FeedResult:
        """Scan ``text`` (the next piece of the stream) and release what is settled."""
        # The hot path: one call per model token, and almost all tokens are prose.
        try:
            if "<" not in text and self.plain:
                return FeedResult(text) if text else _EMPTY
        except TypeError:
            raise TypeError(
                f"InlineToolScanner.feed takes the text of a content delta (str), got "
                f"{type(text).__name__}; decode bytes first and skip None"
            ) from None
        return self._feed(text)

    def flush(self) -> FeedResult:
        """End of stream: release everything still held as plain text.

        An unclosed block is not a parse error (the stream was cut, the model
        did not write a bad block), but ``errors`` says it was shown as text.
        The scanner can be fed again afterwards (ids keep counting).
        """
        errors: Tuple[str, ...] = ()
        if self._mode == _TEXT:
            text = self._held
        else:
            text = "".join(self._block)
            errors = (f"a tool block was still open when the stream ended and was shown as text, "
                      f"not run: {snippet(text)}",)
        self._mode = _TEXT
        self._held = ""
        self.plain = True
        self._reset_block()
        return FeedResult(text, (), errors) if text else _EMPTY

    @property
    def pending_chars(self) -> int:
        """How many fed characters are held back, not yet released as visible."""
        return len(self._held) + self._block_len

    # ------------------------------------------------------------ scanning

    def _reset_block(self) -> None:
        self._block: List[str] = []  # pieces of the open block from earlier feeds
        self._block_len = 0
        self._seg = 0  # index in the current data where the block's new part starts
        self._tag_len = 0
        self._quote = ""
        self._expect_value = False  # just after "=" in a start tag
        self._in_string = False
        self._escape = False
        self._close_seen = 0  # how many chars of "</tool>" matched so far

    def _feed(self, text: str) -> FeedResult:
        data = self._held + text if self._held else text
        self._held = ""
        self._seg = 0
        out: List[str] = []
        calls: List[ToolCall] = []
        errors: List[str] = []
        pos, n = 0, len(data)
        while pos < n:
            if self._mode == _TEXT:
                pos = self._scan_text(data, pos, out)
            elif self._mode == _TAG:
                pos = self._scan_tag(data, pos, out, calls, errors)
            else:
                pos = self._scan_body(data, pos, out, calls, errors)
        if self._mode != _TEXT:
            piece = data[self._seg:]
            if piece:
                self._block.append(piece)
                self._block_len += len(piece)
        self.plain = self._mode == _TEXT and not self._held
        if not (out or calls or errors):
            return _EMPTY
        rejected: Tuple[Tuple[ToolCall, str], ...] = ()
        if self._rejected:
            rejected, self._rejected = tuple(self._rejected), []
        return FeedResult("".join(out), tuple(calls), tuple(errors), rejected)

    def _scan_text(self, data: str, pos: int, out: List[str]) -> int:
        start, n = pos, len(data)
        while True:
            m = data.find("<", pos)
            if m < 0:
                out.append(data[start:])
                return n
            tail = data[m:m + 6]
            if len(tail) == 6:
                if tail[5] in _WS and tail.startswith(_OPEN):
                    if m > start:
                        out.append(data[start:m])
                    self._open_block(m)
                    return m + 6
            elif _OPEN.startswith(tail):
                # Could still become "<tool ": hold these few chars for the next feed.
                if m > start:
                    out.append(data[start:m])
                self._held = tail
                return n
            pos = m + 1

    def _open_block(self, start: int) -> None:
        self._reset_block()
        self._mode = _TAG
        self._seg = start

    def _limit(self) -> int:
        """Index in the current data at which the open block reaches the cap."""
        return self._seg + self.max_block_chars - self._block_len

    def _scan_tag(self, data: str, pos: int, out: List[str], calls: List[ToolCall],
                  errors: List[str]) -> int:
        n, limit = len(data), self._limit()
        end = min(n, limit)
        while pos < end:
            if self._quote:
                q = data.find(self._quote, pos, end)
                if q < 0:
                    pos = end
                    break
                self._quote = ""
                pos = q + 1
                continue
            if self._expect_value:
                m = _NON_WS.search(data, pos, end)
                if m is None:
                    pos = end
                    break
                self._expect_value = False
                pos = m.start()
                if data[pos] in "\"'":
                    self._quote = data[pos]
                    pos += 1
                # else: an unquoted value, scanned on; the attribute parser rejects it.
                continue
            m = _TAG_SPECIAL.search(data, pos, end)
            if m is None:
                pos = end
                break
            i = m.start()
            c = data[i]
            if c == ">":
                return self._end_tag(data, i, out, calls, errors)
            if c == "=":
                self._expect_value = True
                pos = i + 1
                continue
            # A character no start tag can hold here ("<", a stray quote such as an
            # apostrophe in prose, punctuation): this was a mention, not a block.
            # Release it as text now rather than holding the answer back.
            out.append(self._take_block(data, i))
            self._mode = _TEXT
            return i
        if pos >= limit and n > limit:
            return self._give_up(data, limit, out, errors)
        return n

    def _end_tag(self, data: str, i: int, out: List[str], calls: List[ToolCall],
                 errors: List[str]) -> int:
        before = data[i - 1] if i > self._seg else self._block[-1][-1]
        self._tag_len = self._block_len + (i + 1 - self._seg)
        if before == "/":
            return self._close_block(data, i + 1, out, calls, errors, self_closing=True)
        self._mode = _BODY
        return i + 1

    def _scan_body(self, data: str, pos: int, out: List[str], calls: List[ToolCall],
                   errors: List[str]) -> int:
        n, limit = len(data), self._limit()
        end = min(n, limit)
        while pos < end:
            if self._close_seen:
                need = _CLOSE[self._close_seen:]
                got = data[pos:min(pos + len(need), end)]
                if got == need:
                    return self._close_block(data, pos + len(need), out, calls, errors)
                if need.startswith(got):
                    self._close_seen += len(got)
                    pos = end
                    break
                # Mismatch: the "<" was ordinary body text; these few chars are
                # looked at again in body state (none of "/tool" is special).
                self._close_seen = 0
                continue
            if self._escape:
                self._escape = False
                pos += 1
                continue
            if self._in_string:
                m = _STRING_SPECIAL.search(data, pos, end)
                if m is None:
                    pos = end
                    break
                i = m.start()
                if data[i] == '"':
                    self._in_string = False
                else:
                    self._escape = True
                pos = i + 1
            else:
                m = _BODY_SPECIAL.search(data, pos, end)
                if m is None:
                    pos = end
                    break
                i = m.start()
                if data[i] == '"':
                    self._in_string = True
                else:
                    self._close_seen = 1
                pos = i + 1
        if pos >= limit and n > limit:
            return self._give_up(data, limit, out, errors)
        return n

    def _take_block(self, data: str, end: int) -> str:
        """The open block's text up to ``data[end]``; clears the block buffer."""
        self._block.append(data[self._seg:end])
        text = "".join(self._block)
        self._reset_block()
        return text

    def _give_up(self, data: str, limit: int, out: List[str], errors: List[str]) -> int:
        out.append(self._take_block(data, limit))
        self._mode = _TEXT
        self.parse_errors += 1
        errors.append(
            f"tool block longer than {self.max_block_chars} characters was shown as text; "
            f"ask the model for smaller arguments or raise max_block_chars"
        )
        return limit

    def _close_block(self, data: str, end: int, out: List[str], calls: List[ToolCall],
                     errors: List[str], self_closing: bool = False) -> int:
        tag_len = self._tag_len
        text = self._take_block(data, end)
        self._mode = _TEXT
        out.append(text)
        try:
            name, arguments = parse_block(text, tag_len, self_closing, self.max_json_depth)
        except BlockError as exc:
            self.parse_errors += 1
            errors.append(str(exc))
            name, body = block_parts(text, tag_len, self_closing)
            self._rejected.append((ToolCall(id=f"{self.id_prefix}{self._next_id}", name=name, arguments=body),
                                   str(exc)))
            self._next_id += 1
            return end
        calls.append(ToolCall(id=f"{self.id_prefix}{self._next_id}", name=name, arguments=arguments))
        self._next_id += 1
        self.calls_found += 1
        return end

