"""What the raw-socket fault tests share: random bodies after valid headers, peak memory of a refusal.

A client must turn any bytes into an answer or an ``LlmError``; these helpers
play many bodies through one client and measure how much memory refusing a
huge answer takes.
"""
from __future__ import annotations

import random
import tracemalloc
from typing import Any, Callable, List, Sequence, Tuple, Type

import pytest
from faultkit import MESSAGES, streaming
from faultkit_rawserver import STREAM_HEADERS_CLOSE, RawConn, RawServer

from streamengine._errors import LlmError
from streamengine._wait import drive


def random_bodies(seed: int, alphabet: Sequence[bytes], count: int) -> List[bytes]:
    """``count`` bodies of 1 to 40 pieces of ``alphabet``, the same for the same seed."""
    rng = random.Random(seed)
    return [b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def outcomes_of(client_class: Any, bodies: Sequence[bytes], **call: Any) -> List[str]:
    """Stream each body (after 200 event-stream headers) to one client: "answer" or the LlmError's name."""
    outcomes = []

    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(STREAM_HEADERS_CLOSE + bodies[len(conn.server.requests) - 1])

    with RawServer(script) as server, client_class(server.base_url) as client:
        strategy = streaming(client, 2.0, 5.0)
        for _ in bodies:
            try:
                drive(strategy.stream_call(MESSAGES, **call))
                outcomes.append("answer")
            except LlmError as exc:
                outcomes.append(type(exc).__name__)
    return outcomes


def peak_while_refused(call: Callable[[], Any], error: Type[BaseException]) -> Tuple[Any, int]:
    """Run ``call``, which must raise ``error``; return the pytest ExceptionInfo and the peak traced bytes."""
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info, peak
