"""The built-in ``rag_search`` tool: lets the model search what earlier tools returned."""
from __future__ import annotations

from typing import Any

from ..tools import Tool, tool


def make_rag_search_tool(store: Any) -> Tool:
    """A tool bound to ``store``; registered by the engine when it is given a store."""

    @tool(name="rag_search")
    def rag_search(query: str, k: int = 5) -> str:
        """Search the text that earlier tool calls in this conversation returned.

        Use it to find a detail in a long tool result instead of calling the tool again.
        """
        hits = store.search(query, k=max(1, min(int(k), 20)))
        if not hits:
            return f"no stored text matches {query!r}"
        return "\n\n".join(f"[{n}] ({hit.source}) {hit.text}" for n, hit in enumerate(hits, 1))

    return rag_search
