"""Shared helpers for the fault tests (a plain module: tests/faults has no __init__.py).

Frame builders for byte-exact servers, a log capture at TRACE, a wait
recorder that stands in for failover's sleeps, and thread probes.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List

from loguru import logger

from streamengine import enable_logging
from streamengine._calls.strategies import StreamingCallStrategy, make_call_strategy

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


def streaming(client: Any, idle: float, cap: float) -> StreamingCallStrategy:
    strategy = make_call_strategy(client, idle_timeout=idle, completion_timeout=cap)
    assert isinstance(strategy, StreamingCallStrategy)
    return strategy


def stream_threads() -> List[threading.Thread]:
    """Threads a finished call left behind: a call reads in its caller's thread, so none may
    remain but the shared deadline watcher, which ends once no call is watched."""
    from conftest import wait_for

    def left() -> List[threading.Thread]:
        return [t for t in threading.enumerate() if t.is_alive()
                and t.name.startswith("streamengine-stream")]

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


