"""Tools on a caller's concurrent.futures.Executor: a real ProcessPoolExecutor and a real Dask LocalCluster.

The tools live at the top of this module so that another process can import
them by name.  A tool that "never returns" polls a release file (an Event
cannot reach another process) and its context's deadline; teardown creates
the file so that no worker process or thread is left running.

Dask runs with ``processes=False`` (workers are threads of this process):
process workers take seconds each to start on a small machine.  The process
pool covers the other-process case; the Dask cluster the same-process one,
where the tool also sees the real cancel flag.
"""
from __future__ import annotations

import concurrent.futures
import importlib
import json
import multiprocessing
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import wait_for
from remote_tools import read_note_when, write_note

from streamengine import ToolCall, ToolError
from streamengine.tools import ToolContext, ToolExecutor, tool

GUARD_S = 20.0
_ids = iter(range(1, 10_000))


@tool(executor="remote")
def where(label: str, ctx: ToolContext) -> dict:
    """Say which process ran the call and how long it had."""
    return {"label": label, "pid": os.getpid(), "remaining": ctx.remaining()}


@tool(executor="remote")
def boom(reason: str) -> str:
    raise ValueError(reason)


@tool(executor="remote")
def hold(release: str, ctx: ToolContext, note: str = "") -> str:
    """Return when the release file exists, the call is cancelled, or its deadline passes.

    With ``note``, write "running" there on entry and the outcome on exit:
    the test's view into a call whose result it never gets.
    """
    outcome = "released"
    write_note(note, "running")
    while not os.path.exists(release):
        if ctx.cancelled:
            outcome = "stopped: cancelled" if ctx.cancel_event.is_set() else "stopped: deadline"
            break
        time.sleep(0.02)
    write_note(note, outcome)
    return outcome


@tool
def local_pid() -> int:
    return os.getpid()


def call(name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(f"call_{next(_ids)}", name, arguments)


def _hold_args(release: Path) -> str:
    return json.dumps({"release": str(release)})


def _our_threads() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("streamengine-")}


@pytest.fixture
def release(tmp_path) -> Iterator[Path]:
    path = tmp_path / "release"
    yield path
    path.touch()


@pytest.fixture(scope="module")
def process_pool() -> Iterator[concurrent.futures.Executor]:
    # Both workers start now and import this module's tools as they start, so a one-second
    # deadline never includes a process start or an import (on a busy machine those take longer).
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=importlib.import_module, initargs=(__name__,))
    assert all(f.result() != os.getpid() for f in [pool.submit(os.getpid) for _ in range(2)])
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def dask_executor() -> Iterator[concurrent.futures.Executor]:
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=4, processes=False, host="127.0.0.1", protocol="tcp://",
                                       dashboard_address=":0")
    client = distributed.Client(cluster)
    yield client.get_executor()
    client.close()
    cluster.close()


@pytest.fixture(params=["process_pool", "dask_executor"])
def remote(request) -> Iterator[concurrent.futures.Executor]:
    yield request.getfixturevalue(request.param)


@pytest.fixture
def executor(remote) -> Iterator[ToolExecutor]:
    before = _our_threads()
    made = ToolExecutor(max_workers=2, remote=remote)
    yield made
    made.shutdown(wait=True, timeout=GUARD_S)
    # Remote calls start no pool thread of ours; each result is settled on a short-lived thread.
    assert wait_for(lambda: not (_our_threads() - before)), _our_threads() - before


def test_start_hands_over_and_results_come_in_call_order(executor, remote):
    started: List[str] = []
    handles = [executor.submit(where, call("where", json.dumps({"label": label})), timeout=GUARD_S,
                               on_start=lambda h: started.append(h.call.id)) for label in ("a", "b", "c")]
    assert started == [h.call.id for h in handles]  # "started" = handed over, in submit order
    results = [h.result() for h in handles]
    assert all(r.ok for r in results), [r.error for r in results]
    payloads = [json.loads(r.text) for r in results]
    assert [p["label"] for p in payloads] == ["a", "b", "c"]
    if isinstance(remote, concurrent.futures.ProcessPoolExecutor):
        assert all(p["pid"] != os.getpid() for p in payloads)
    assert all(0 < p["remaining"] <= GUARD_S for p in payloads)  # the deadline crossed as wall-clock time
    assert all(r.started_at == h.started_at and r.queue_wait_s == h.queue_wait_s for r, h in zip(results, handles))
    assert executor.submit(local_pid, call("local_pid"), timeout=GUARD_S).result().text == str(os.getpid())


def test_a_tool_that_raises_is_an_error_result(executor):
    result = executor.submit(boom, call("boom", '{"reason": "bad input"}'), timeout=GUARD_S).result()
    assert not result.ok and result.error == "tool 'boom' failed: ValueError: bad input"


def test_deadline_gives_a_timeout_and_the_remote_side_sees_it(executor, release):
    handle = executor.submit(hold, call("hold", _hold_args(release)), timeout=0.5)
    result = handle.result()
    assert result.timed_out and result.error == "tool 'hold' timed out after 0.5s"
    assert handle.cancel_event.is_set()


def test_cancel_of_a_running_remote_call(executor, remote, release):
    entered = threading.Event()
    handle = executor.submit(hold, call("hold", _hold_args(release)), timeout=GUARD_S,
                             on_start=lambda h: entered.set())
    assert entered.wait(GUARD_S)
    handle.cancel()
    assert handle.done()  # abandoned at once, whether or not the remote side can stop
    result = handle.result()
    assert not result.ok and not result.timed_out and result.error == "tool 'hold' cancelled"


def test_same_process_remote_tools_see_the_real_cancel_flag(dask_executor, release, tmp_path):
    note = tmp_path / "note"
    with ToolExecutor(remote=dask_executor) as executor:
        arguments = json.dumps({"release": str(release), "note": str(note)})
        handle = executor.submit(hold, call("hold", arguments), timeout=GUARD_S)
        assert read_note_when(note, done=False) == "running"
        handle.cancel()
        assert handle.result().error == "tool 'hold' cancelled"
        assert read_note_when(note, done=True) == "stopped: cancelled"


def test_other_process_tools_stop_at_their_wall_clock_deadline(process_pool, release, tmp_path):
    note = tmp_path / "note"
    with ToolExecutor(remote=process_pool) as executor:
        arguments = json.dumps({"release": str(release), "note": str(note)})
        handle = executor.submit(hold, call("hold", arguments), timeout=1.0)
        assert read_note_when(note, done=False) == "running"
        handle.cancel()  # cannot cross the process boundary: the remote call runs to its deadline
        assert handle.result().error == "tool 'hold' cancelled"
        assert read_note_when(note, done=True) == "stopped: deadline"


def test_the_caller_cancel_event_reaches_a_remote_call(executor, release):
    cancel = threading.Event()
    handle = executor.submit(hold, call("hold", _hold_args(release)), timeout=GUARD_S, cancel=cancel)
    cancel.set()
    assert handle.wait(GUARD_S) and not handle.result().ok


# --------------------------------------------------------------------------- placement and pickling


def test_tools_that_cannot_travel_are_refused_at_decoration():
    with pytest.raises(ToolError, match=r"tool 'lam' asks for executor='remote'.*it is a lambda"):
        tool(lambda: "", name="lam", executor="remote")

    def nested() -> str:
        return ""

    with pytest.raises(ToolError, match=r"defined inside another function .*define it with def at the top level"):
        tool(nested, executor="remote")
    with pytest.raises(ToolError, match=r"executor of tool 'nested' must be 'local' or 'remote', got 'gpu'"):
        tool(nested, executor="gpu")


def test_remote_tools_run_locally_without_a_remote_executor():
    with ToolExecutor() as executor:
        result = executor.submit(where, call("where", '{"label": "here"}'), timeout=GUARD_S).result()
    assert result.ok and f'"pid": {os.getpid()}' in result.text


def test_tool_context_pickles_with_a_wall_clock_deadline():
    event = threading.Event()
    event.set()
    context = ToolContext(event, time.monotonic() + 30)
    copy = pickle.loads(pickle.dumps(context))
    assert 29 < copy.remaining() <= 30 and abs(copy.deadline - context.deadline) < 0.5
    assert not copy.cancel_event.is_set()  # the event does not cross: a fresh one
    assert pickle.loads(pickle.dumps(ToolContext())).deadline is None
