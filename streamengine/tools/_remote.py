"""Running a tool on any ``concurrent.futures.Executor``: a process pool, a Dask cluster, ...

What crosses to the other side is a :class:`RemoteCall`: the tool *by
reference* (module and qualified name, as pickle sends functions), the
validated arguments and a :class:`ToolContext` whose deadline travels as
wall-clock time.  The other side imports the module and runs the tool there,
converting its return value to text before it comes back, so an odd return
value never has to be pickled.

"Started" for a remote call means handed over to the executor: its deadline
counts from then, and includes any time the call waits in the remote
executor's own queue.  A deadline or cancel calls ``Future.cancel()``, which
stops a call still queued remotely; one already running there runs on (no
executor can stop a Python function) and its result is discarded.  When the
executor runs the call in *this* process (a thread pool, Dask with
``processes=False``), the tool also sees the real cancel flag.

At most once: Dask re-runs the task of a worker that died on another worker
(the scheduler's ``allowed-failures``, 3 by default, which ``retries=`` does
not cover), so a side-effect tool could run four times.  On a Dask worker a
call therefore marks its start in a ``distributed.Event`` named by its
token, and a second start of the same call refuses with an error naming the
dead worker's fate instead of running the tool again.  The mark is cleared
when the tool returns (a finished call is never rescheduled).
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import os
import pickle
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

from .._errors import ToolError
from .._tool_context import ToolContext

_tokens = itertools.count(1)
_events: weakref.WeakValueDictionary[str, threading.Event] = weakref.WeakValueDictionary()
_resolved: Dict[Tuple[str, str, str], Any] = {}
_resolved_lock = threading.Lock()


def remote_reference(fn: Callable[..., Any], name: str) -> Tuple[str, str]:
    """``(module, qualname)`` another process can import ``fn`` by; :class:`ToolError` if there is none."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    why = None
    if inspect.ismethod(fn):
        why = "it is a bound method (its object would have to travel with it)"
    elif not module or not qualname:
        why = "it has no module-level name"
    elif "<lambda>" in qualname:
        why = "it is a lambda"
    elif "<locals>" in qualname:
        why = "it is defined inside another function (a closure or nested function)"
    if why is not None:
        raise ToolError(f"tool {name!r} asks for executor='remote', but it cannot be sent to another process: "
                        f"{why}; define it with def at the top level of an importable module")
    return module, qualname  # type: ignore[return-value]


def share_cancel_event(event: threading.Event) -> str:
    """A token by which a call that runs in *this* process finds the real cancel flag."""
    # Unique across the processes and machines that share one cluster (the pid alone is not).
    token = f"{os.getpid()}-{next(_tokens)}-{uuid.uuid4().hex}"
    _events[token] = event
    return token


@dataclass(frozen=True)
class RemoteCall:
    """A picklable, argument-less callable: ``executor.submit(call)`` runs one tool call anywhere."""

    module: str
    qualname: str
    tool_name: str
    args: Dict[str, Any]
    context: ToolContext
    token: str

    def __call__(self) -> str:
        tool = _resolve(self.module, self.qualname, self.tool_name)
        context = self.context
        pid, _, _ = self.token.partition("-")
        event = _events.get(self.token) if pid == str(os.getpid()) else None
        if event is not None:  # same process: the tool can see the cancel flag
            context = ToolContext(event, context.deadline)
        started = _mark_started_on_dask(self.token, self.tool_name)
        try:
            return tool._invoke(dict(self.args), context)
        except Exception as exc:
            raise _sendable(exc) from None
        finally:
            if started is not None:
                started.clear()


def _mark_started_on_dask(token: str, tool_name: str) -> Any:
    """On a Dask worker: mark the call started cluster-wide (the mark, to clear), or refuse a second start.

    Elsewhere (a process pool, which never re-runs a call) there is nothing to mark: None.
    """
    try:
        from distributed import Event, get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        return None
    mark = Event(f"streamengine-call-{token}")
    if mark.is_set():
        raise RemoteToolError(
            f"tool {tool_name!r} was already started on a Dask worker that died (or was lost) while running it, "
            f"and the scheduler rescheduled it onto {worker.address}; it is not run a second time, since remote "
            f"tools run at most once: check the dead worker's log, then call it again only if it has no side "
            f"effects that may already have happened")
    mark.set()
    return mark


class RemoteToolError(Exception):
    """A remote tool's exception that could not travel back as itself; its text says what it was."""


def _sendable(exc: Exception) -> Exception:
    """``exc`` if it survives a pickle round trip, else a stand-in carrying ``Type: message``.

    An exception whose ``__init__`` takes other arguments than its ``args``
    fails to unpickle in the caller, and a ``ProcessPoolExecutor`` that meets
    one is broken for every later call of every run.
    """
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RemoteToolError(f"{type(exc).__name__}: {exc}")


def _resolve(module: str, qualname: str, tool_name: str) -> Any:
    from ._tool import Tool

    key = (module, qualname, tool_name)
    with _resolved_lock:
        found = _resolved.get(key)
    if found is not None:
        return found
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    tool = obj if isinstance(obj, Tool) and obj.name == tool_name else Tool(getattr(obj, "fn", obj), name=tool_name)
    with _resolved_lock:
        _resolved[key] = tool
    return tool
