"""The MCP server the tests start: slow tools, a failing one, one that exits, one without annotations,
one whose annotations contradict each other.

Run as ``python lab.py http PORT RECORD`` (streamable HTTP on 127.0.0.1),
``python lab.py stdio RECORD``, or ``python lab.py forks``: that one reads a
JSON line ``{"port": ..., "record": ...}`` at a time on stdin and forks an
HTTP server for each, printing its pid (the SDK's import, a second of CPU, is
paid once; every server is still a fresh process).  Every call of ``slow`` appends a JSON line
to RECORD when it starts, when it ends, and when its handler is cancelled,
so a test can see what the *server* did, not only what the client got.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from typing import TypedDict

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

READ_ONLY = ToolAnnotations(readOnlyHint=True)
RECORD = sys.argv[-1]
server = MCPServer("lab")


def note(event: str, tag: str) -> None:
    with open(RECORD, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "tag": tag, "t": time.time(), "pid": os.getpid()}) + "\n")


@server.tool(annotations=READ_ONLY, title="Slow lookup")
async def slow(seconds: float, tag: str, ctx: Context) -> str:
    """Wait ``seconds``, then answer; records start, end and cancellation."""
    note("start", tag)
    try:
        steps = max(1, int(seconds / 0.25))
        for step in range(steps):
            await anyio.sleep(seconds / steps)
            await ctx.report_progress(step + 1, steps)
    except anyio.get_cancelled_exc_class():
        note("cancelled", tag)
        raise
    note("end", tag)
    return f"slow {tag} done"


@server.tool(annotations=READ_ONLY)
def boom(reason: str) -> str:
    """Always fails, with the reason given (a ToolError: the SDK passes its text on)."""
    raise ToolError(f"boom: {reason}")


@server.tool(annotations=READ_ONLY)
def exit_now(code: int) -> str:
    """Ends the server process at once with exit status ``code``."""
    print(f"lab server exiting with status {code} on request", file=sys.stderr, flush=True)
    os._exit(code)


@server.tool()
def plain(text: str) -> str:
    """A tool without annotations: the spec's defaults make it a side-effect tool."""
    note("plain", text)
    return text.upper()


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=True))
def wipe(text: str) -> str:
    """Claims to be read-only and destructive at once: the engine must take the dangerous word."""
    note("wipe", text)
    return f"wiped {text}"


class Counts(TypedDict):
    chars: int
    words: int


@server.tool(annotations=READ_ONLY, structured_output=True)
def measure(text: str) -> Counts:
    """Structured output: counts of ``text``."""
    return {"chars": len(text), "words": len(text.split())}


@server.tool(annotations=READ_ONLY)
def picture() -> Image:
    """An image result (a 1x1 PNG)."""
    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8"
                           "AAAAASUVORK5CYII=")
    return Image(data=png, format="png")


#: What ``contents(kind)`` answers: the shapes of a CallToolResult a client must turn into text.
CONTENTS = {
    "texts": lambda: CallToolResult(content=[TextContent(text="one"), TextContent(text="two")]),
    "structured": lambda: CallToolResult(content=[], structured_content={"a": 1, "b": "é"}),
    "text-and-structured": lambda: CallToolResult(content=[TextContent(text="one")], structured_content={"a": 1}),
    "media": lambda: CallToolResult(content=[
        ImageContent(data="aGVsbG8=", mime_type="image/png"),
        ResourceLink(uri="file:///tmp/report.pdf", name="report"),
        EmbeddedResource(resource=TextResourceContents(uri="memo://1", text="memo text", mime_type="text/plain")),
        EmbeddedResource(resource=BlobResourceContents(uri="blob://2", blob="AAAA")),
    ]),
    "error": lambda: CallToolResult(content=[TextContent(text="no such customer")], is_error=True),
    "silent-error": lambda: CallToolResult(content=[], is_error=True),
}


@server.tool(annotations=READ_ONLY)
def contents(kind: str) -> CallToolResult:
    """A result of the given ``kind`` (see ``CONTENTS``), exactly as built here."""
    return CONTENTS[kind]()


@server.tool(annotations=READ_ONLY)
async def traced(ctx: Context) -> str:
    """The request's ``_meta`` as JSON: what a tracing client sent (``traceparent``)."""
    meta = getattr(ctx.request_context, "meta", None)
    if hasattr(meta, "model_dump"):
        meta = meta.model_dump(by_alias=True, exclude_none=True)
    return json.dumps(meta if isinstance(meta, dict) else {}, default=str)


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool called ``name`` and tell listening clients that the tool list changed."""
    def added() -> str:
        return f"{name} was added at run time"

    server.add_tool(added, name=name, description="A tool added while the server runs.", annotations=READ_ONLY)
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await ctx.notify_tools_changed()  # to subscriptions/listen streams
    else:
        await ctx.session.send_tool_list_changed()  # the handshake era's plain notification
    return f"added {name}"


def serve_http(port: int, record: str) -> None:
    global RECORD
    RECORD = record
    server.run("streamable-http", host="127.0.0.1", port=port)


def fork_servers() -> None:
    """One HTTP server per line read, each a fork of this process; its pid is the reply."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the servers as they end
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                serve_http(job["port"], job["record"])
            finally:
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "http":
        serve_http(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "forks":
        fork_servers()
    else:
        server.run("stdio")
