"""The built-in ``rag_search`` tool: lets the model search what earlier tools of its conversation returned.

Each run gets its own instance bound to the run's scope (its conversation,
or itself), so a search never sees what another conversation filed; the
scope is never an argument the model could change.
"""
from __future__ import annotations

from typing import Any, Optional

from .._errors import ToolError
from ..tools import Tool, tool


def make_rag_search_tool(store: Any, scope: Optional[str]) -> Tool:
    """A tool bound to ``store`` and ``scope``; the engine makes one per run.

    ``scope=None`` gives the engine's registered copy (its spec is what the
    model sees); called outside a run it refuses, since it would not know
    whose text to search.
    """

    @tool(name="rag_search")
    def rag_search(query: str, k: int = 5) -> str:
        """Search the text that earlier tool calls in this conversation returned (only this conversation's).

        Use it to find a detail in a long tool result instead of calling the tool again.
        """
        if scope is None:
            raise ToolError("rag_search runs only inside an engine run: it searches that run's conversation")
        hits = store.search(query, k=max(1, min(int(k), 20)), scope=scope)
        if not hits:
            return f"no stored text matches {query!r}"
        return "\n\n".join(f"[{n}] ({hit.source}) {hit.text}" for n, hit in enumerate(hits, 1))

    return rag_search
