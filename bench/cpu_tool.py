"""The CPU-bound tool of section 10, at module level so another process can import it by name.

A tool declared ``executor="remote"`` travels by reference (module and
qualified name): a process-pool or Dask worker imports this module and runs
``spin`` there.  ``spin`` is pure-Python arithmetic: it holds the GIL of
whichever process runs it for its whole duration, which is exactly what a
placement choice is about.
"""
from __future__ import annotations

import time

from streamengine import tool


def arithmetic(n: int) -> int:
    acc = 0
    for k in range(n):
        acc = (acc * 31 + k) % 1_000_003
    return acc


@tool(name="spin", executor="remote")
def spin(n: int) -> str:
    """Crunches numbers: ``n`` rounds of pure-Python arithmetic (~200 ms at the bench's n)."""
    return str(arithmetic(n))


def iterations_for(seconds: float) -> int:
    """How many ``arithmetic`` rounds take ``seconds`` here (best of 3 short timings: least disturbed)."""
    best = min(_timed(200_000) for _ in range(3))
    return max(1, int(200_000 * seconds / best))


def _timed(n: int) -> float:
    t0 = time.perf_counter()
    arithmetic(n)
    return time.perf_counter() - t0


def warm(seconds: float) -> str:
    """Run on each worker before measuring: imports this module and the engine's remote side, then waits.

    The wait keeps the worker busy so a pool's next warm-up call lands on
    another worker (every worker started and imported before the clock runs).
    """
    time.sleep(seconds)
    return "warm"
