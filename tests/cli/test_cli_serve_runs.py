"""``streamengine serve --runs URL --detach-grace S``: runs in a log, resumed after a restart, ended on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamengine import ConfigError
from streamengine.runs import MemoryRunLog, SqliteRunLog, open_run_log
from streamengine.testing import FakeProvider, RunClient
from streamengine.testing import steps as s

ROOT = Path(__file__).resolve().parents[2]


def start_serve(fp: FakeProvider, *args: str) -> tuple:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    serve = subprocess.Popen([sys.executable, "-m", "streamengine", "serve", "--port", "0", "-m", "m",
                              "--base-url", fp.base_url, *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    first = serve.stdout.readline()
    assert "serving on" in first, first + serve.stderr.read()
    return serve, first.split("serving on ")[1].split()[0].rstrip("/")


def test_sigterm_ends_a_running_run_with_worker_shutdown_and_the_log_keeps_it(tmp_path):
    url = f"sqlite:///{tmp_path}/runs.sqlite"  # four slashes: an absolute path
    with FakeProvider() as fp:
        fp.add_turn(*[step for i in range(400) for step in (s.text(f"w{i} "), s.delay(0.05))])
        serve, base = start_serve(fp, "--runs", url, "--detach-grace", "30")
        try:
            client = RunClient(base)
            events = client.start([{"role": "user", "content": "count"}])
            assert next(e for e in events if e.event == "message")
            serve.send_signal(signal.SIGTERM)
            began = time.monotonic()
            rest = list(events)
            assert time.monotonic() - began < 8
            assert rest[-1].event == "error" and rest[-1].json()["code"] == "worker_shutdown"
            out, err = serve.communicate(timeout=30)
            assert serve.returncode == 0 and "stopped" in out, err
            # The log outlives the server: a new one serves the finished run from it.
            serve, base = start_serve(fp, "--runs", url)
            status = RunClient(base).status(client.run_id)
            assert status["state"] == "failed" and status["terminal"]["data"]["code"] == "worker_shutdown"
        finally:
            if serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
                serve.communicate(timeout=30)


def test_open_run_log_reads_each_url_form(tmp_path):
    assert isinstance(open_run_log("memory:"), MemoryRunLog)
    log = open_run_log(f"sqlite:///{tmp_path}/a.sqlite")
    assert isinstance(log, SqliteRunLog) and log.path == f"{tmp_path}/a.sqlite"
    log.close()
    for bad in ("", "ftp://host/x", "sqlite://"):
        with pytest.raises(ConfigError, match="run log URL"):
            open_run_log(bad)
