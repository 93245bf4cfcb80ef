"""Shared helpers for the fault tests (a plain module: tests/faults has no __init__.py).

Frame builders for byte-exact servers, a log capture at TRACE, calls as the
engine makes them, and thread probes.
"""
from __future__ import annotations

import json
import re
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List, Sequence

from engine_calls import EngineCall
from loguru import logger

from streamengine import enable_logging

MESSAGES = [{"role": "user", "content": "hi"}]
GUARD_S = 10.0  # failure guards only: nothing here asserts speed


def frame(payload: Any) -> bytes:
    """One SSE event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n"


def content_frame(text: str) -> bytes:
    return frame({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def finish_frame(reason: str = "stop") -> bytes:
    return frame({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})


EMPTY_DELTA = frame({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
KEEP_ALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


def streaming(client: Any, idle: float, cap: float) -> EngineCall:
    """Single calls on ``client`` as the engine makes them, with these deadlines (see engine_calls)."""
    return EngineCall(client, idle=idle, cap=cap)


def failing_over(client: Any, idle: float, cap: float, models: Sequence[str], max_retries: int = 2) -> EngineCall:
    """Calls that fail over from model to model, retrying a rate limit as the engine does by default."""
    return EngineCall(client, idle=idle, cap=cap, models=models, max_retries=max_retries)


def stream_threads() -> List[threading.Thread]:
    """Threads a finished call left behind: a call reads in its caller's thread, so none may
    remain but the shared deadline watcher, which ends once no call is watched."""
    from conftest import wait_for

    def left() -> List[threading.Thread]:
        return [t for t in threading.enumerate() if t.is_alive()
                and (t.name.startswith("streamengine-stream") or t.name == "streamengine-deadlines")]

    wait_for(lambda: not left(), timeout=5.0)
    return left()


@contextmanager
def captured_logs(level: str = "TRACE") -> Iterator[List[str]]:
    """Every formatted streamengine log line (exceptions included) while the block runs."""
    lines: List[str] = []
    handler = enable_logging(level=level, sink=lines.append)
    try:
        yield lines
    finally:
        try:
            logger.remove(handler)
        except ValueError:
            pass
        logger.disable("streamengine")




def backoffs(lines: List[str]) -> List[float]:
    """The back-offs failover logged (``retrying in 0.2s``), in seconds, in order."""
    return [float(found.group(1)) for line in lines for found in [re.search(r"retrying in ([0-9.]+)s", line)]
            if found]
