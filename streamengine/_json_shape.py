"""Whether streamed JSON arguments can be complete yet, followed fragment by fragment.

Interleaved tool calls are checked for completeness after every fragment of
another call; joining and parsing the whole text each time made two
interleaved streams cost quadratic time.  :class:`JsonShape` follows the
brackets and strings of each fragment once (a regex skips the plain text),
so only an object whose outer brace has closed is ever parsed.
"""
from __future__ import annotations

import re

__all__ = ["JsonShape"]

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
