"""Tools for the engine-on-a-remote-executor tests, at module level so another process can import them.

A remote tool is sent by reference (module and name); a worker process of a
``ProcessPoolExecutor`` or a Dask cluster imports this module to run it.
Events cannot cross a process boundary, so a tool that has to wait for the
test waits for a *file* to appear; a test's view into a call whose result it
never gets is a "note" file the tool writes on entry and on exit.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from streamengine.tools import ToolContext, tool

#: The longest any tool here waits for anything: a failure guard, never reached in a passing run.
GUARD_S = 30.0

#: What ``fetch_notes`` returns somewhere in the middle of a long page; the RAG test searches for it.
PHRASE = "the heron nests beside quartzite cliffs"


@tool(executor="remote")
def lookup(city: str, ctx: ToolContext) -> str:
    """Weather for a city, with the process that answered and the seconds its call had left."""
    return json.dumps({"weather": f"sunny in {city}", "pid": os.getpid(), "remaining": ctx.remaining()})


@tool(executor="remote")
def crash(reason: str) -> str:
    """Fail with the reason given."""
    raise ValueError(reason)


class StoreError(Exception):
    """An exception whose ``__init__`` does not take its ``args``: it cannot be unpickled as itself."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")


@tool(executor="remote")
def crash_oddly(reason: str) -> str:
    """Fail with an exception that does not survive a pickle round trip."""
    raise StoreError(7, reason)


@tool(executor="remote")
def linger(release: str, ctx: ToolContext, note: str = "") -> str:
    """A well-behaved slow tool: returns when ``release`` exists, or stops at its cancel or deadline."""
    write_note(note, "running")
    outcome = "released"
    while not os.path.exists(release):
        if ctx.cancelled:
            outcome = "stopped: cancelled" if ctx.cancel_event.is_set() else "stopped: deadline"
            break
        time.sleep(0.02)
    write_note(note, outcome)
    return outcome


@tool(executor="remote")
def stuck(release: str, note: str) -> str:
    """A tool that never returns by itself: it ignores its deadline until ``release`` exists."""
    write_note(note, "running")
    give_up_at = time.monotonic() + GUARD_S
    while not os.path.exists(release) and time.monotonic() < give_up_at:
        time.sleep(0.02)
    write_note(note, "returned")
    return "finally"


@tool(executor="remote")
def after_file(path: str) -> str:
    """Answer only once ``path`` exists (another tool of the same round creates it)."""
    give_up_at = time.monotonic() + GUARD_S
    while not os.path.exists(path) and time.monotonic() < give_up_at:
        time.sleep(0.01)
    return f"remote saw {Path(path).read_text()}" if os.path.exists(path) else "remote gave up waiting"


@tool(executor="remote")
def fetch_notes(topic: str) -> str:
    """A long page about a topic, long enough to be filed in several chunks."""
    filler = " ".join(f"word{i}" for i in range(400))
    return f"{filler}. Field notes on {topic}: {PHRASE}. {filler}"


def write_note(path: str, text: str) -> None:
    """Replace the note atomically, so a reader never sees half a word."""
    if path:
        Path(path + ".tmp").write_text(text)
        os.replace(path + ".tmp", path)


def read_note_when(path: Path, done: bool) -> str:
    """The note once it exists (``done=False``) or once it says more than "running" (``done=True``)."""
    give_up_at = time.monotonic() + GUARD_S
    while time.monotonic() < give_up_at:
        if path.exists() and (not done or path.read_text() != "running"):
            return path.read_text()
        time.sleep(0.01)
    return path.read_text() if path.exists() else "(no note)"


@tool(executor="remote", side_effects=False)
def die_mid_call(log: str) -> str:
    """Notes each start in ``log``, then kills the worker process running it (a crash mid-tool)."""
    with open(log, "a") as out:
        out.write(f"{os.getpid()}\n")
    os._exit(1)
