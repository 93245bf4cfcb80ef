"""Bidi marks and zero-width characters reach a terminal as visible stand-ins, like every other control.

``for_terminal`` is what chat and the CLI print model, tool and MCP text
through: a right-to-left mark or a zero-width space would reorder or hide
what a person reads (two tool names that look alike, an argument that is
not what it seems in an approval question).
"""
from __future__ import annotations

import pytest

from streamengine._logs import for_terminal

INVISIBLE = [0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
             0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF]


@pytest.mark.parametrize("code", INVISIBLE, ids=[f"U+{c:04X}" for c in INVISIBLE])
def test_each_bidi_or_zero_width_character_is_shown_not_obeyed(code):
    assert for_terminal(f"rm{chr(code)}dir") == f"rm<U+{code:04X}>dir"


def test_printable_neighbours_and_right_to_left_letters_are_left_alone():
    text = "\u2010 hyphen, \u2011 no-break hyphen, \u2070 superscript; caf\u00e9 \u05e9\u05dc\u05d5\u05dd \u0627"
    assert for_terminal(text) == text
