"""The built-in ``rag_search`` tool: lets the model search what earlier tools of its conversation returned.

Each run gets its own instance bound to the run's scope (its conversation,
or itself), so a search never sees what another conversation filed; the
scope is never an argument the model could change.  The instance is a copy
of one template made per engine: the schema (a pydantic model) is built
once, not per run.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

from .._errors import ToolError
from ..tools import Tool, tool


def _searcher(store: Any, scope: Optional[str]) -> Callable[..., str]:
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


def make_rag_search_tool(store: Any, scope: Optional[str]) -> Tool:
    """A tool bound to ``store`` and ``scope``.

    ``scope=None`` gives the engine's registered template (its spec is what
    the model sees); called outside a run it refuses, since it would not
    know whose text to search.
    """
    return tool(name="rag_search")(_searcher(store, scope))


def bound_to_scope(template: Tool, store: Any, scope: str) -> Tool:
    """``template`` (from :func:`make_rag_search_tool`) searching ``scope``: same schema, no rebuild.

    The function has the template's signature, so the checked arguments the
    template's schema produces fit it.
    """
    bound = copy.copy(template)
    object.__setattr__(bound, "fn", _searcher(store, scope))  # Tool refuses plain assignment
    return bound
