"""The command line as ``llm`` users type it, rewritten into what argparse takes.

Kept apart from the parser: these are habits (two-word ``-o``, a bare
prompt), not flags, and each rewrite is a plain function of the words.
"""
from __future__ import annotations

from typing import List

COMMANDS = ("chat", "serve", "demo", "harness", "logs", "mcp")
_TOP_LEVEL = ("-h", "--help", "--version")


def llm_style(argv: List[str]) -> List[str]:
    """The command line as argparse takes it: ``-o KEY VALUE`` as ``-o KEY=VALUE``, a bare prompt as chat.

    ``-o`` takes one word; ``llm`` users write two (``-o temperature 0.5``).
    A first word that is no command (``streamengine "why?"``,
    ``streamengine -m gpt-4o "why?"``) starts a ``chat``, as ``llm "why?"`` does.
    """
    out: List[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in ("-o", "--option") and i + 2 < len(argv) and "=" not in argv[i + 1] \
                and (not argv[i + 2].startswith("-") or _is_number(argv[i + 2])):
            out += [word, f"{argv[i + 1]}={argv[i + 2]}"]
            i += 3
            continue
        out.append(word)
        i += 1
    first = next((n for n, word in enumerate(out) if not _is_verbosity(word)), None)
    if first is None or out[first] in COMMANDS or out[first] in _TOP_LEVEL:
        return out
    return out[:first] + ["chat"] + out[first:]


def _is_verbosity(word: str) -> bool:
    return word == "--verbose" or (len(word) > 1 and word[0] == "-" and set(word[1:]) == {"v"})


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
