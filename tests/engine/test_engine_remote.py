"""The engine's tool scenarios, unchanged, with the tools on a real process pool and a real Dask cluster.

Every test runs twice, through ``StreamingEngine(..., executor=remote)``:

* ``process_pool``: a ``ProcessPoolExecutor`` (spawn context) -- the tool
  runs in another process, which cannot see the run's cancel flag, only its
  deadline;
* ``dask``: a ``distributed.LocalCluster`` on 127.0.0.1 with
  ``processes=False`` (it starts in ~0.2 s here, a process worker in ~1.8 s):
  the call still travels through the scheduler over TCP, pickled, but runs on
  a Dask worker thread of this process, where it also sees the cancel flag.

One executor of each kind serves the whole module; the FakeProvider speaks
real HTTP on loopback.  The tools live in ``remote_tools`` (module level, so
a worker process can import them); a tool that must wait for the test waits
for a file, and the ``release`` fixture creates it at teardown so that no
call outlives its test by more than a poll.

The last test runs the examples of "Heavy tools on processes or Dask" in
docs/scaling.md, copied out of the page, so the page cannot drift from what
works.

Thread-leak guard: ``no_leak`` is the suite's ``no_thread_leak`` check,
taken *after* the executor exists and ignoring threads whose name holds
"Dask-": Dask's worker threads (which run the tools under ``processes=False``)
and its callback/offload threads belong to the module-wide cluster, which
starts them lazily and keeps them until it closes.  Every thread of ours --
the run's, the tool pool's, the provider's -- is still checked.
"""
from __future__ import annotations

import concurrent.futures
import importlib
import json
import multiprocessing
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, List

import pytest
import remote_tools
from conftest import wait_for
from remote_tools import PHRASE, after_file, crash, fetch_notes, linger, lookup, read_note_when, stuck, write_note

from streamengine import (
    DoneEvent,
    EngineConfig,
    OpenAICompatibleClient,
    SqliteRagStore,
    StreamingEngine,
    ToolStartEvent,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool

TOOL_TIMEOUT_S = 10.0  # the deadline of calls expected to finish: a guard, never reached


# --------------------------------------------------------------------------- executors


@pytest.fixture(scope="module")
def process_pool() -> Iterator[concurrent.futures.Executor]:
    # Each worker imports the tools as it starts, and both start now (with the pool's manager
    # and feeder threads), so a short deadline never includes a process start or an import
    # and the leak guard sees those threads beforehand.
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=importlib.import_module, initargs=("remote_tools",))
    assert all(f.result() != os.getpid() for f in [pool.submit(os.getpid) for _ in range(2)])
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=4, processes=False, host="127.0.0.1",
                                       protocol="tcp://", dashboard_address=":0")
    client = distributed.Client(cluster)
    assert client.get_executor().submit(os.getpid).result() == os.getpid()
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def dask(dask_client) -> concurrent.futures.Executor:
    return dask_client.get_executor()


@pytest.fixture(params=["process_pool", "dask"])
def remote(request) -> concurrent.futures.Executor:
    return request.getfixturevalue(request.param)


@pytest.fixture(autouse=True)
def no_leak(request) -> Iterator[None]:
    """The suite's thread-leak guard, minus the module-wide Dask cluster's own threads (see the docstring)."""
    for executor in ("remote", "dask_client"):
        if executor in request.fixturenames:
            request.getfixturevalue(executor)  # the executor and its threads exist before the snapshot

    def alive() -> set:
        return {t for t in threading.enumerate() if t.is_alive() and "Dask-" not in t.name}

    before = alive()
    yield

    def leaked():
        return [t.name for t in alive() - before if not t.name.startswith("pytest")]

    wait_for(lambda: not leaked(), timeout=5.0)
    assert leaked() == [], f"threads left behind: {leaked()}"


@pytest.fixture
def release(tmp_path) -> Iterator[Path]:
    path = tmp_path / "release"
    yield path
    path.touch()


# --------------------------------------------------------------------------- helpers


def make_engine(fp, tools, remote, rag=None, **config) -> StreamingEngine:
    config.setdefault("models", ["m1"])
    config.setdefault("tool_timeout", TOOL_TIMEOUT_S)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config), rag=rag,
                           executor=remote)


def block(name: str, args: dict) -> str:
    return f'<tool name="{name}">{json.dumps(args)}</tool>'


def ask(engine: StreamingEngine) -> List:
    return list(engine.run([{"role": "user", "content": "question"}]))


def done(events):
    assert isinstance(events[-1], DoneEvent), [e.name for e in events]
    return events[-1].result


def continuation(fp, round_no: int = 2) -> str:
    """What the model was told about the tools in the request of round ``round_no``."""
    return fp.requests[round_no - 1].json["messages"][-1]["content"]


# --------------------------------------------------------------------------- scenarios


def test_a_tool_started_mid_stream_feeds_its_result_to_the_next_round(provider, remote):
    started = threading.Event()
    provider.add_turn(s.text("Checking. "), s.text(block("lookup", {"city": "Oslo"})),
                      s.wait(started, timeout=10), s.text(" still talking"))
    provider.add_turn(s.text("It is sunny in Oslo."))
    with make_engine(provider, [lookup], remote) as engine:
        events = []
        for event in engine.run([{"role": "user", "content": "weather?"}]):
            events.append(event)
            if isinstance(event, ToolStartEvent):
                started.set()  # only now does the provider send the rest of round 1
    result = done(events)
    order = [e.name for e in events]
    later = next(i for i, e in enumerate(events) if getattr(e, "text", None) == " still talking")
    assert order.index("tool_start") < later
    assert result.answer == "It is sunny in Oslo." and result.telemetry.tools_ok == 1
    payload = json.loads(result.tool_results[0].text)
    assert payload["weather"] == "sunny in Oslo"
    if isinstance(remote, concurrent.futures.ProcessPoolExecutor):
        assert payload["pid"] != os.getpid()
    # The ToolContext that crossed over carries the call's deadline.
    assert 0 < payload["remaining"] < TOOL_TIMEOUT_S
    assert "sunny in Oslo" in continuation(provider)


def test_a_tool_past_its_deadline_is_a_timeout_and_the_run_goes_on(provider, remote, release):
    provider.add_turn(s.text(block("linger", {"release": str(release)})))
    provider.add_turn(s.text("The tool was too slow."))
    with make_engine(provider, [linger], remote, tool_timeout=0.5) as engine:
        result = done(ask(engine))
    assert result.tool_results[0].error == "tool 'linger' timed out after 0.5s"
    assert result.telemetry.tools_timed_out == 1
    assert "timed out after 0.5s" in continuation(provider)
    assert result.answer == "The tool was too slow."


def test_a_tool_that_raises_is_an_error_result_naming_the_exception(provider, remote):
    provider.add_turn(s.text(block("crash", {"reason": "the disk is full"})))
    provider.add_turn(s.text("It failed."))
    with make_engine(provider, [crash], remote) as engine:
        result = done(ask(engine))
    assert result.tool_results[0].error == "tool 'crash' failed: ValueError: the disk is full"
    assert result.telemetry.tools_failed == 1
    assert "ValueError: the disk is full" in continuation(provider)


def test_an_exception_that_cannot_travel_back_is_named_and_the_pool_survives(provider, remote):
    provider.add_turn(s.text(block("crash_oddly", {"reason": "disk full"})))
    provider.add_turn(s.text(block("lookup", {"city": "Oslo"})))
    provider.add_turn(s.text("done"))
    with make_engine(provider, [remote_tools.crash_oddly, remote_tools.lookup], remote) as engine:
        result = done(ask(engine))
    failed, looked_up = result.tool_results
    assert not failed.ok and "StoreError: code 7: disk full" in failed.error
    assert looked_up.ok and "sunny in Oslo" in looked_up.text  # the pool still works


def test_a_tool_that_never_returns_is_abandoned_at_its_deadline(provider, remote, release, tmp_path):
    note = tmp_path / "note"
    provider.add_turn(s.text(block("stuck", {"release": str(release), "note": str(note)})))
    provider.add_turn(s.text("Gave up on it."))
    with make_engine(provider, [stuck], remote, tool_timeout=0.5) as engine:
        result = done(ask(engine))
    assert result.tool_results[0].error == "tool 'stuck' timed out after 0.5s"
    assert result.answer == "Gave up on it."
    # The run ended while the call was still running on the other side: nothing waited for it.
    assert read_note_when(note, done=False) == "running"
    release.touch()
    assert read_note_when(note, done=True) == "returned"


def test_closing_the_generator_mid_run_ends_the_run(provider, remote, release, tmp_path):
    note = tmp_path / "note"
    provider.add_turn(s.text("start " + block("linger", {"release": str(release), "note": str(note)})), s.stall())
    with make_engine(provider, [linger], remote, tool_timeout=1.0) as engine:
        run = engine.run([{"role": "user", "content": "q"}])
        names = []
        for event in run:
            names.append(event.name)
            if isinstance(event, ToolStartEvent):
                assert read_note_when(note, done=False) == "running"
                break
        run.close()
        assert names[-1] == "tool_start" and "done" not in names
        outcome = read_note_when(note, done=True)
    if isinstance(remote, concurrent.futures.ProcessPoolExecutor):
        assert outcome == "stopped: deadline"  # the cancel flag cannot cross processes; the deadline did
    else:
        assert outcome == "stopped: cancelled"  # same process: the tool saw the run's cancel flag


def test_the_round_cap_skips_the_second_remote_call(provider, remote):
    provider.add_turn(s.text(block("lookup", {"city": "Oslo"}) + block("lookup", {"city": "Bergen"})))
    provider.add_turn(s.text("Only Oslo."))
    with make_engine(provider, [lookup], remote, max_tools_per_round=1) as engine:
        result = done(ask(engine))
    assert result.telemetry.tools_started == 1 and result.telemetry.cap_skipped == 1
    oslo, bergen = result.tool_results
    assert oslo.ok and "sunny in Oslo" in oslo.text
    assert not bergen.ok and "limit" in bergen.error
    told = continuation(provider)
    assert "sunny in Oslo" in told and "sunny in Bergen" not in told and "limit" in told


@tool
def mark_file() -> str:
    """A local tool of the same round as the remote one."""
    return "marked"


def test_a_local_and_a_remote_tool_in_one_round_answer_in_call_order(provider, remote, tmp_path):
    flag = str(tmp_path / "flag")
    # The remote call is first but finishes only once the local one's result was told: the consumer
    # writes the file the remote tool waits for when it sees that result (atomically: never half of it).
    provider.add_turn(s.text(block("after_file", {"path": flag}) + block("mark_file", {})))
    provider.add_turn(s.text("Both answered."))
    with make_engine(provider, [after_file, mark_file], remote) as engine:
        events = []
        for event in engine.run([{"role": "user", "content": "q"}]):
            events.append(event)
            if event.name == "tool_result" and event.result.name == "mark_file":
                write_note(flag, "the mark")
    result = done(events)
    finished = [e.result.name for e in events if e.name == "tool_result"]
    assert finished == ["mark_file", "after_file"]  # the order they finished in
    assert [r.name for r in result.tool_results] == ["after_file", "mark_file"]  # the order they were called in
    assert [r.text for r in result.tool_results] == ["remote saw the mark", "marked"]
    told = continuation(provider)
    assert told.index("remote saw the mark") < told.index("marked")


def test_remote_results_are_filed_and_found_by_rag_search_next_round(provider, remote):
    provider.add_turn(s.text("Fetching. " + block("fetch_notes", {"topic": "herons"})))
    provider.add_turn(s.text("Let me look closer. " + block("rag_search", {"query": "heron quartzite", "k": 2})))
    provider.add_turn(s.text("Herons nest by quartzite cliffs."))
    with SqliteRagStore() as store:
        filed_on = []
        add_chunks = store.add_chunks

        def recording_add_chunks(*args, **kwargs):
            filed_on.append(threading.current_thread().name)
            return add_chunks(*args, **kwargs)

        store.add_chunks = recording_add_chunks
        with make_engine(provider, [fetch_notes], remote, rag=store) as engine:
            result = done(ask(engine))
        fetched, search = result.tool_results
        assert [fetched.name, search.name] == ["fetch_notes", "rag_search"]
        assert store.count(source=f"tool:fetch_notes:{fetched.call_id}") > 1
        # Filed on the store's own filing thread, never on a tool worker, the pool's manager or Dask's loop.
        assert filed_on == ["streamengine-filing"]
    assert search.ok and PHRASE in search.text
    assert PHRASE in continuation(provider, round_no=3)


# --------------------------------------------------------------------------- the examples in docs/scaling.md

DOCS = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"


def doc_examples() -> dict:
    """The section's python blocks, by the file name each one opens with (``# name.py``)."""
    text = DOCS.read_text()
    section = text[text.index("## Heavy tools on processes or Dask"):]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n# (\w+\.py)[^\n]*\n(.*?)```", section, re.S)
    return {name: f"# {name}\n{body}" for name, body in blocks}


@pytest.fixture
def examples_dir(tmp_path, monkeypatch) -> Iterator[Path]:
    """The examples as files; importable here too, as they would be on every Dask worker."""
    for name, code in doc_examples().items():
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("heavy_tools", "pool_app", "dask_app"):
        sys.modules.pop(name, None)


def test_the_docs_examples_run_their_tool_remotely_and_answer(examples_dir, dask_client, monkeypatch, capsys):
    """Each example's main(), run here, against a FakeProvider and (for Dask) this module's cluster."""
    assert sorted(p.name for p in examples_dir.iterdir()) == ["dask_app.py", "heavy_tools.py", "pool_app.py"]
    monkeypatch.setenv("DASK_SCHEDULER", dask_client.scheduler.address)
    words = "the cat and the dog and the end"
    for script in ("pool_app", "dask_app"):
        with FakeProvider() as llm:
            llm.add_turn(s.text("Counting. " + block("word_stats", {"text": words})))
            llm.add_turn(s.text(f"'the' it is ({script})."))
            monkeypatch.setenv("LLM_BASE_URL", llm.base_url)
            importlib.import_module(script).main()
        assert capsys.readouterr().out == f"'the' it is ({script}).\n"
        told = continuation(llm)
        assert '"words": 8' in told and '["the", 3]' in told and '["and", 2]' in told, told
