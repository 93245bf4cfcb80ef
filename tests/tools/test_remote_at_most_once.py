"""A Dask worker that dies mid-tool does not make the tool run again (at most once).

A real ``distributed.LocalCluster`` with one worker *process* under a nanny:
the tool kills its own worker process (``os._exit``), the nanny starts a new
worker, and the scheduler reschedules the task there (``allowed-failures``).
The call's start mark refuses that second start, so the tool's function is
entered exactly once and the run gets an error result saying why.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from remote_tools import die_mid_call

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s


def test_a_tool_whose_dask_worker_dies_runs_once_and_says_so(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    # the workers import remote_tools
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1] / "support"))
    log = tmp_path / "starts.log"
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  protocol="tcp://", dashboard_address=":0", silence_logs=50) as cluster, \
            distributed.Client(cluster) as client, FakeProvider() as fp:
        fp.add_turn(s.text(f'<tool name="die_mid_call">{json.dumps({"log": str(log)})}</tool>'))
        fp.add_turn(s.text("it could not run"))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [die_mid_call],
                             EngineConfig(models=["m"], tool_timeout=45), executor=client.get_executor()) as engine:
            result = engine.complete([{"role": "user", "content": "go"}])
    starts = Path(log).read_text().split()
    assert len(starts) == 1, starts  # without the mark: one start per allowed failure, then KilledWorker
    outcome = result.tool_results[0]
    assert not outcome.ok and "at most once" in outcome.error and "died" in outcome.error
    assert "rescheduled it onto tcp://127.0.0.1:" in outcome.error
    assert result.answer == "it could not run"
