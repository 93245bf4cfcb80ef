"""12. MCP tools: how soon a call reaches the server, and what starting it mid-stream saves.

Two measurements against a real MCP server (this module, run as
``python -m bench.mcp_calls stdio|http ...``, built on the SDK's
``MCPServer``), over stdio and over streamable HTTP:

* **dispatch**: from the provider writing a ``</tool>`` (FakeProvider's
  ``signal`` step, right after the block) to the server's handler starting
  (the server's own ``time.time()``).  One stream carries the calls, 30 ms
  apart, so each is measured alone.  Target: p99 < 10 ms.
* **round**: a 2 s answer with three 1 s MCP calls at 0.3, 0.8 and 1.3 s.
  ``ready`` = request sent -> the stream has ended *and* all three results
  are in.  ``engine``: the tool is read-only, so it starts at its
  ``</tool>``; ``after``: the same tool without annotations, so the engine
  holds it until the stream has ended (then all three run at once).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Tuple

from .common import median, percentile

TARGET_P99_MS = 10.0
GAP_S = 0.03
CALLS_AT_S = (0.3, 0.8, 1.3)
ANSWER_S = 2.0


# --------------------------------------------------------------------------- the server

def serve(argv: List[str]) -> None:
    """The bench's MCP server: ``stamp`` records when its handler starts; ``wait``/``wait_after`` sleep."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    record = argv[-1]
    server = MCPServer("bench")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def stamp(tag: str) -> str:
        """Note when the handler started."""
        with open(record, "a") as out:
            out.write(json.dumps({"tag": tag, "t": time.time()}) + "\n")
        return tag

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def wait(seconds: float) -> str:
        """Sleep (a slow lookup)."""
        await anyio.sleep(seconds)
        return "waited"

    @server.tool()
    async def wait_after(seconds: float) -> str:
        """The same, without annotations: a side-effect tool for the engine."""
        await anyio.sleep(seconds)
        return "waited"

    if argv[0] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


class _WallStamp(threading.Event):
    """Set by FakeProvider's ``signal`` step: remembers ``time.time()`` (the server's clock too)."""

    at = 0.0

    def set(self) -> None:
        if not self.is_set():
            self.at = time.time()
        super().set()


# --------------------------------------------------------------------------- runs

def _servers(record: str) -> List[Tuple[str, Any, Any]]:
    """(transport, McpServer, process to stop or None) for stdio and HTTP."""
    from streamengine.mcp import McpServer

    module = [sys.executable, "-m", "bench.mcp_calls"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    http = subprocess.Popen(module + ["http", str(port), record], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return [("stdio", McpServer.stdio(*module, "stdio", record, name="bench-stdio"), None),
            ("http", McpServer.http(f"http://127.0.0.1:{port}/mcp", name="bench-http"), http)]


def _engine(fp: Any, tools: List[Any], calls: int = 3) -> Any:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine

    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools,
                           EngineConfig(models=["m"], idle_timeout=30, completion_timeout=120, tool_timeout=30,
                                        max_tools_per_round=calls, max_tools_total=calls))


def _block(name: str, args: Dict[str, Any]) -> str:
    return f'<tool name="{name}">{json.dumps(args)}</tool>'


def dispatch(server: Any, record: str, calls: int, label: str) -> List[float]:
    """Milliseconds from each ``</tool>`` written to the server's handler starting."""
    stamps = _stamped_run(server.tools(include={"stamp"}, eager=True), calls, label)
    seen = {}
    with open(record) as lines:
        for line in lines:
            entry = json.loads(line)
            seen[entry["tag"]] = entry["t"]
    missing = [i for i in range(calls) if f"{label}{i}" not in seen]
    if missing:
        raise RuntimeError(f"{len(missing)} of {calls} stamp calls never reached the {label} server")
    return [(seen[f"{label}{i}"] - stamp.at) * 1000 for i, stamp in enumerate(stamps)]


def dispatch_python(calls: int) -> List[float]:
    """The baseline: the same stream and calls, to a Python tool on the engine's pool."""
    from streamengine import tool

    entered: Dict[str, float] = {}

    @tool(name="stamp")
    def stamp(tag: str) -> str:
        """Note when the function was entered."""
        entered[tag] = time.time()
        return tag

    stamps = _stamped_run([stamp], calls, "py")
    return [(entered[f"py{i}"] - st.at) * 1000 for i, st in enumerate(stamps)]


def _stamped_run(tools: List[Any], calls: int, label: str) -> List[_WallStamp]:
    """One run whose stream writes ``calls`` stamp calls, GAP_S apart; each ``</tool>`` time is kept."""
    from streamengine.testing import FakeProvider
    from streamengine.testing import steps as s

    stamps = [_WallStamp() for _ in range(calls)]
    steps: List[Any] = [s.text("Stamping.")]
    for i, stamp in enumerate(stamps):
        steps += [s.text(_block("stamp", {"tag": f"{label}{i}"})), s.signal(stamp), s.delay(GAP_S)]
    with FakeProvider() as fp:
        fp.add_turn(*steps)
        fp.add_turn(s.text("ok"))
        engine = _engine(fp, tools, calls)
        try:
            engine.complete([{"role": "user", "content": "go"}])
        finally:
            engine.close()
            engine.client.close()
    return stamps


def round_ready(server: Any, tool: str) -> float:
    """Seconds from the request to: the stream ended and all three results are in."""
    from streamengine.testing import FakeProvider
    from streamengine.testing import steps as s

    ended = _WallStamp()
    steps: List[Any] = []
    written = 0.0
    for at in CALLS_AT_S:
        steps += [s.delay(at - written), s.text(_block(tool, {"seconds": 1.0}))]
        written = at
    steps += [s.delay(ANSWER_S - written), s.text(" end of answer."), s.signal(ended)]
    with FakeProvider() as fp:
        fp.add_turn(*steps)
        fp.add_turn(s.text("ok"))
        engine = _engine(fp, server.tools(include={tool}, eager=True))
        last_result = 0.0
        began = time.time()
        try:
            for event in engine.run([{"role": "user", "content": "go"}]):
                if event.name == "tool_result":
                    last_result = time.time()
                elif event.name == "round" and event.round > 1:
                    break
        finally:
            engine.close()
            engine.client.close()
    return max(last_result, ended.at) - began


def run(quick: bool = False) -> Dict[str, Any]:
    calls, repeats = (30, 1) if quick else (200, 3)
    out: Dict[str, Any] = {"calls": calls, "gap_ms": GAP_S * 1000, "repeats": repeats}
    out["python"] = {"dispatch_ms": _summary(dispatch_python(calls))}
    with tempfile.TemporaryDirectory() as scratch:
        record = os.path.join(scratch, "stamps.jsonl")
        open(record, "w").close()
        for transport, server, process in _servers(record):
            try:
                with server:
                    latencies = dispatch(server, record, calls, transport)
                    engine = [round_ready(server, "wait") for _ in range(repeats)]
                    after = [round_ready(server, "wait_after") for _ in range(repeats)]
            finally:
                if process is not None:
                    process.terminate()
                    process.wait(10)
            out[transport] = {"dispatch_ms": _summary(latencies),
                              "round_s": {"engine": median(engine), "after": median(after)}}
    return out


def _summary(ms: List[float]) -> Dict[str, float]:
    return {"n": len(ms), "p50": median(ms), "p99": percentile(ms, 99), "max": max(ms)}


def lines(t: Dict[str, Any], verdict: Any) -> List[str]:
    """The table's lines for this section."""
    out = [f"12. MCP tools - </tool> written -> the MCP server's handler started ({t['calls']} calls, "
           f"{t['gap_ms']:.0f} ms apart); a 2 s answer with 3 x 1 s MCP calls at 0.3/0.8/1.3 s",
           f"   {'transport':<10}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'ready: eager':>15}{'after stream':>14}"
           f"{'saved':>8}"]
    for transport in ("stdio", "http", "python"):
        v = t[transport]
        d = v["dispatch_ms"]
        row = f"   {transport:<10}{d['p50']:>8.2f}{d['p99']:>8.2f}{d['max']:>8.2f}"
        if "round_s" in v:
            r = v["round_s"]
            row += f"{r['engine']:>14.2f}s{r['after']:>13.2f}s{r['after'] - r['engine']:>7.2f}s"
        else:
            row += "   (baseline: a Python tool on the engine's pool)"
        out.append(row)
    worst = max(t[x]["dispatch_ms"]["p99"] for x in ("stdio", "http"))
    out.append(f"   target dispatch p99 < {TARGET_P99_MS:.0f} ms over stdio and HTTP: {verdict(worst < TARGET_P99_MS)} "
               f"(worst p99 {worst:.2f} ms)")
    return out


if __name__ == "__main__":
    serve(sys.argv[1:])
