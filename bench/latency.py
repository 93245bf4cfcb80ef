"""2. Dispatch latency: the server wrote the frame that ends ``</tool>`` -> the tool function runs.

The server records ``time.monotonic()`` right after ``sendall`` of that frame
returned; the tool records ``time.monotonic()`` as its first statement.  Both
clocks are CLOCK_MONOTONIC (system-wide on Linux), so the difference is the
dispatch latency: loopback, HTTP and SSE parsing, the producer -> reader hop,
the inline parser, the dispatcher gates and the tool pool's hand-off.

Between tool blocks the model keeps talking (prose tokens), and each block
arrives in pieces, as models write them.  The baseline is the floor: a raw
socket reader that calls the function itself, in the reading thread, the
moment a content delta holds ``</tool>``.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Tuple

from .common import Server, chunked_lines, content_frame, finish_frames, percentile, post_raw, seg

MESSAGES = [{"role": "user", "content": "latency"}]
PROSE = [" The", " answer", " depends", " on", " the", " data", ",", " so", " let", " me", " check", "."]


def _script(stream: int, calls: int, gap_s: float) -> List[Dict[str, Any]]:
    segments = [seg("".join(content_frame(t) for t in PROSE * 3))]
    for i in range(calls):
        pieces = ['<tool', ' name="mark', '">{"s": ', str(stream), ', "i": ', str(i), '}']
        segments.append(seg("".join(content_frame(p) for p in PROSE + pieces), delay=gap_s))
        segments.append(seg(content_frame("</tool>"), mark=f"s{stream}-i{i}"))
    segments.append(seg("".join(content_frame(t) for t in PROSE) + finish_frames(), delay=gap_s))
    return segments


def _engine_latencies(server: Server, streams: int, calls: int, models: List[str]) -> List[float]:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    ran: Dict[str, float] = {}

    @tool(name="mark")
    def mark(s: int, i: int) -> str:
        """Records when it started."""
        ran[f"s{s}-i{i}"] = time.monotonic()
        return "ok"

    latencies: List[float] = []
    for model in models:
        config = EngineConfig(models=[model], tool_mode="inline", max_tools_per_round=calls,
                              max_tools_total=calls, max_continuations=1, pool_size=8)
        with StreamingEngine(OpenAICompatibleClient(server.base_url), [mark], config) as engine:
            server.marks(clear=True)
            result = engine.complete(MESSAGES)
            if result.error or result.telemetry.tools_ok != calls:
                raise RuntimeError(f"latency: engine run failed: {result.error or result.telemetry}")
        latencies += _match(server.marks(clear=True), ran)
        ran.clear()
    return latencies


def _raw_latencies(server: Server, models: List[str]) -> List[float]:
    """The floor: no threads, no parser; call the function in the reading thread."""
    ran: Dict[str, float] = {}

    def mark(s: int, i: int) -> None:
        ran[f"s{s}-i{i}"] = time.monotonic()

    latencies: List[float] = []
    for stream, model in enumerate(models):
        server.marks(clear=True)
        sock = post_raw(server.port, "/v1/chat/completions", {"model": model, "messages": MESSAGES,
                                                               "stream": True})
        seen = 0
        try:
            for lines in chunked_lines(sock):
                for line in lines:
                    if line[:6] == b"data: " and line != b"data: [DONE]":
                        choices = json.loads(line[6:])["choices"]
                        if choices and "</tool>" in (choices[0]["delta"].get("content") or ""):
                            mark(stream, seen)
                            seen += 1
        finally:
            sock.close()
        latencies += _match(server.marks(clear=True), ran)
        ran.clear()
    return latencies


def _match(marks: List[Tuple[str, float]], ran: Dict[str, float]) -> List[float]:
    out = []
    for name, written in marks:
        if name not in ran:
            raise RuntimeError(f"latency: tool call {name} never ran")
        out.append(ran[name] - written)
    return out


def run(server: Server, streams: int = 10, calls: int = 20, gap_s: float = 0.01) -> Dict[str, Any]:
    models = [server.script(f"latency-{s}", _script(s, calls, gap_s)) for s in range(streams)]
    raw = _raw_latencies(server, models)
    engine = _engine_latencies(server, streams, calls, models)
    summary = {}
    for key, values in (("raw", raw), ("engine", engine)):
        summary[key] = {"n": len(values), "p50_ms": percentile(values, 50) * 1e3,
                        "p99_ms": percentile(values, 99) * 1e3, "max_ms": max(values) * 1e3}
    return summary
