"""Parameter descriptions from a tool's docstring (Google ``Args:`` or Sphinx ``:param x:``).

The docstring is where Python authors already describe parameters; reading
it means the model gets those descriptions without a second copy in code.
"""
from __future__ import annotations

import inspect
import re
from typing import Dict, List, Optional, Tuple

_SECTION_RE = re.compile(r"^(\s*)(?:Args|Arguments|Parameters|Params)\s*:\s*$")
_ENTRY_RE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_RE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: Optional[str]) -> Tuple[str, Dict[str, str]]:
    """First paragraph as the description, plus ``Args:`` / ``:param x:`` entries."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: List[str] = []
    for line in lines:
        if not line.strip() or _SECTION_RE.match(line) or _SPHINX_RE.match(line):
            break
        summary.append(line.strip())
    return " ".join(summary), _parse_param_docs(lines)


def _parse_param_docs(lines: List[str]) -> Dict[str, str]:
    params: Dict[str, str] = {}
    section_indent: Optional[int] = None
    entry_indent: Optional[int] = None
    current: Optional[str] = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        sphinx = _SPHINX_RE.match(line)
        if sphinx:
            current, section_indent = sphinx.group(1), None
            params[current] = sphinx.group(2).strip()
            entry_indent = indent
            continue
        header = _SECTION_RE.match(line)
        if header:
            section_indent, entry_indent, current = len(header.group(1)), None, None
            continue
        if not line.strip():
            continue
        if section_indent is None and current is None:
            continue
        if section_indent is not None and indent <= section_indent:
            section_indent, current = None, None  # the next section began
            continue
        entry = _ENTRY_RE.match(line) if section_indent is not None else None
        if entry and (entry_indent is None or indent <= entry_indent):
            entry_indent, current = indent, entry.group(2)
            params[current] = entry.group(3).strip()
        elif current is not None and entry_indent is not None and indent > entry_indent:
            params[current] = (params[current] + " " + line.strip()).strip()
        else:
            current = None
    return params
