"""Tools from MCP servers (Model Context Protocol), started while the model is still talking.

::

    from streamengine.mcp import McpServer

    with McpServer.stdio("mcp-server-time", "--local-timezone", "UTC") as clock:
        engine = StreamingEngine(client, tools=[*clock.tools(), my_tool])

Needs the ``mcp`` extra (``pip install 'streamengine[mcp]'``, Python 3.10+).
See docs/mcp.md for which tools start mid-stream (none by default: ``tools(eager=...)`` or
``tools(trust_annotations=True)``), limits, deadlines, cancellation and faults.
"""
from __future__ import annotations

import sys

if sys.version_info < (3, 10):  # pragma: no cover - the SDK itself needs 3.10
    raise ImportError("streamengine.mcp needs Python 3.10 or newer (the MCP SDK does); this is "
                      f"Python {sys.version_info.major}.{sys.version_info.minor}")
try:
    import mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("streamengine.mcp needs the MCP SDK: pip install 'streamengine[mcp]'") from exc

from ._server import McpServer as McpServer
from ._tools import McpTool as McpTool
from ._tools import McpToolError as McpToolError
from ._transports import McpLimits as McpLimits

__all__ = ["McpLimits", "McpServer", "McpTool", "McpToolError"]
