"""Shared fixtures: a FakeProvider per test, and a guard that no thread outlives its test."""
from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import List

import pytest

# The CLI's run log (and anything else kept under the user's data dir) goes to a
# throwaway directory: a test run must never write a developer's ~/.local/share.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="streamengine-tests-data-")


def _alive_threads() -> set:
    return {t for t in threading.enumerate() if t.is_alive()}


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true; a failure guard, not a speed assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture
def no_thread_leak():
    """Fails the test if threads it started are still alive shortly after it ends."""
    before = _alive_threads()
    yield

    def leaked() -> List[threading.Thread]:
        return [t for t in _alive_threads() - before if not t.name.startswith("pytest")]

    wait_for(lambda: not leaked(), timeout=5.0)
    assert leaked() == [], f"threads left behind: {[t.name for t in leaked()]}"


@pytest.fixture
def provider():
    from streamengine.testing import FakeProvider

    with FakeProvider() as fp:
        yield fp


# Modules whose tests share a module-scoped resource worth making once: a Chromium, a process
# pool, a Dask cluster, a mypy run.  Under pytest-xdist each runs whole on one worker; every other
# test is scheduled on its own, wherever a worker is free.
ONE_WORKER_MODULES = frozenset({
    "tests/web/test_browser.py", "tests/web/test_takeover_page.py", "tests/engine/test_engine_remote.py",
    "tests/tools/test_executor_remote.py", "tests/test_types.py",
})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Load scheduling, except that each of ONE_WORKER_MODULES is one unit of work.

    xdist's own ``--dist loadgroup`` does this by a mark, but it tags node ids in a way
    pytest 9.2 no longer lets a plugin do; a scope of one's own is the documented hook.
    """
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return OneWorkerModules(config, log)


def pytest_collection_finish(session):
    """Move what collection imported (SDKs, Dask, Django...) out of the collector's way.

    A full collection over those objects is a pause of a few hundred ms on older
    Pythons, long enough to land inside the 0.2 s idle timers some tests use.
    """
    import gc

    gc.collect()
    gc.freeze()
