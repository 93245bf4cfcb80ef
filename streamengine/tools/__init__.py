"""Tools: plain functions the model may call, and the pool that runs them.

``schema`` turns a signature into a JSON schema and checks arguments against
it; ``tool`` holds :class:`Tool`, ``@tool`` and :class:`ToolRegistry`;
``executor`` runs calls on owned threads (or a remote executor) with deadlines, and
``handle`` is the per-call state machine it drives.  What a call returns
(:class:`ToolResult`) and what a running tool sees (:class:`ToolContext`)
live in :mod:`streamengine._messages`, below this package, since the engine
uses them too; they are re-exported here.
"""
from .._messages import ToolContext as ToolContext
from .._messages import ToolResult as ToolResult
from ._executor import ToolExecutor as ToolExecutor
from ._handle import ToolHandle as ToolHandle
from ._tool import Tool as Tool
from ._tool import ToolRegistry as ToolRegistry
from ._tool import ToolReturnError as ToolReturnError
from ._tool import load_tools as load_tools
from ._tool import result_to_text as result_to_text
from ._tool import tool as tool

__all__ = [
    "Tool", "ToolContext", "ToolExecutor", "ToolHandle", "ToolRegistry", "ToolResult", "ToolReturnError",
    "load_tools", "result_to_text", "tool",
]
