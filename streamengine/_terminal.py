"""Text for a terminal: control characters shown, never obeyed.

Model, tool and MCP server text is hostile input, and a terminal obeys what
it is sent: ``ESC ] 52`` writes the clipboard, ``ESC ] 8`` hides a link
behind harmless words, ``ESC [ 2J`` clears the screen, a bidi override
reorders what a person reads.  :func:`for_terminal` replaces each such
character one by one with a visible stand-in, so it is as safe on a stream
cut into tokens (an escape sequence split between two) as on whole lines.
"""
from __future__ import annotations

from typing import Any, Dict

#: Bidi embedding, override and isolate controls: they reorder the text around them.
_BIDI = tuple(range(0x202A, 0x202F)) + tuple(range(0x2066, 0x206A))


def _table() -> Dict[int, str]:
    table: Dict[int, str] = {}
    for code in range(0x20):
        if chr(code) not in "\t\n":
            table[code] = "^" + chr(code + 0x40)  # caret notation, as cat -v and less show them: ESC is ^[
    table[0x7F] = "^?"
    for code in tuple(range(0x80, 0xA0)) + _BIDI:  # C1 controls (0x9B is an 8-bit CSI) and bidi controls
        table[code] = f"<U+{code:04X}>"
    return table


_VISIBLE = _table()


def for_terminal(text: str) -> str:
    """``text`` with every control character but tab and newline made visible (``ESC`` becomes ``^[``).

    A carriage return before a newline is dropped (the terminal shows the
    line the same); any other one is shown as ``^M``: it would let later
    text overwrite what came before it on the line.
    """
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(_VISIBLE)


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a closed stream or one without ``isatty`` is not)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except ValueError:  # a closed stream
        return False
