"""What the tests that the garbage collector must not rescue share.

A run's objects should die with their last reference (reference counting);
a test of that turns the collector off, or a collection would hide the bug.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator, List

from streamengine import DoneEvent


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The collector off inside, on again after if it was on before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def left_for_the_collector(run: Callable[[], List[Any]]) -> List[str]:
    """The streamengine objects ``run`` leaves in reference cycles (their type names), the collector off meanwhile."""
    with collector_off():
        gc.collect()
        try:
            events = run()
            assert isinstance(events[-1], DoneEvent), events[-1]
            del events
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            return [type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("streamengine")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
