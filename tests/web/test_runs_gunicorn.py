"""Runs on several real gunicorn gthread workers behind a round-robin proxy: a worker dies, freezes, is stopped.

Two gunicorn servers (one gthread worker each) share one run log (SQLite,
Redis, PostgreSQL); a small TCP proxy in the test sends each new connection
to the next one, so a run's producer and its other reader sit on different
workers.  The signals are real: ``kill -9`` of the producing worker, SIGSTOP
then SIGCONT, SIGTERM (with the ``post_worker_init`` hook docs/deployment.md
shows, calling ``shutdown_runs``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import requests
from run_log_kinds import open_log, shared_logs  # noqa: F401 - a fixture

from streamengine.testing import FakeProvider, RunClient, RunEvent
from streamengine.testing import steps as s

gunicorn = pytest.importorskip("gunicorn", reason="gunicorn is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
LEASE_S = 1.0

APP = textwrap.dedent("""
    import json, os
    from run_log_kinds import open_log
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
    from streamengine.wsgi import make_wsgi_app

    engine = StreamingEngine(OpenAICompatibleClient(os.environ["SE_PROVIDER"]), [],
                             EngineConfig(models=["m"], idle_timeout=30, completion_timeout=120))
    inner = make_wsgi_app(engine, runs=open_log(json.loads(os.environ["SE_LOG"])), heartbeat_s=0.2,
                          lease_s=float(os.environ["SE_LEASE"]), detach_grace_s=30, take_over=False)

    def app(environ, start_response):
        def start(status, headers, exc_info=None):
            return start_response(status, headers + [("X-Worker-Pid", str(os.getpid()))], exc_info)
        return inner(environ, start)
""")

# What docs/deployment.md shows: gthread's worker_exit comes too late for SIGTERM, so the worker's own
# SIGTERM handler ends its runs first, then does what gunicorn's does.
CONF = textwrap.dedent("""
    import signal

    def post_worker_init(worker):
        from streamengine.runs import shutdown_runs
        graceful = signal.getsignal(signal.SIGTERM)

        def end_runs_then_exit(signum, frame):
            shutdown_runs(timeout_s=5)
            graceful(signum, frame)

        signal.signal(signal.SIGTERM, end_runs_then_exit)
""")


@contextmanager
def gunicorn_worker(tmp_path: Path, provider_url: str, log_spec: dict, app: str = APP) -> Iterator[str]:
    (tmp_path / "se_runs_app.py").write_text(app)
    (tmp_path / "se_runs_conf.py").write_text(CONF)
    env = dict(os.environ, SE_PROVIDER=provider_url, SE_LOG=json.dumps(log_spec), SE_LEASE=str(LEASE_S),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(SUPPORT), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
                             "--threads", "6", "--bind", "127.0.0.1:0", "--graceful-timeout", "10",
                             "--config", str(tmp_path / "se_runs_conf.py"), "--log-level", "info",
                             "se_runs_app:app"], env=env, stderr=subprocess.PIPE, text=True)
    drain = None
    try:
        url = ""
        for line in proc.stderr:
            match = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", line)
            if match:
                url = match.group(1)
            if "Booting worker" in line:
                break
        assert url, "gunicorn did not say where it listens"
        drain = threading.Thread(target=lambda: [None for _ in proc.stderr], name="test-gunicorn-log")
        drain.start()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if drain is not None:
            drain.join(5)


class RoundRobinProxy:
    """A TCP proxy on 127.0.0.1 sending each new connection to the next backend in turn."""

    def __init__(self, backends: List[Tuple[str, int]]) -> None:
        self.backends = backends
        self.turn = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: List[socket.socket] = []
        self.threads: List[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, name="test-proxy", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            backend = self.backends[self.turn % len(self.backends)]
            self.turn += 1
            try:
                upstream = socket.create_connection(backend, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.sockets += [client, upstream]
            self._start(self._pump, client, upstream)
            self._start(self._pump, upstream, client)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone does not, on Linux)
        except OSError:
            pass
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self.threads:
            thread.join(5)


@contextmanager
def two_workers(tmp_path: Path, fp: FakeProvider, spec: dict, app: str = APP) -> Iterator[str]:
    with ExitStack() as stack:
        urls = []
        for index in range(2):
            folder = tmp_path / f"w{index}"
            folder.mkdir()
            urls.append(stack.enter_context(gunicorn_worker(folder, fp.base_url, spec, app)))
        proxy = RoundRobinProxy([(u.split("//")[1].split(":")[0], int(u.rsplit(":", 1)[1])) for u in urls])
        stack.callback(proxy.close)
        yield f"http://127.0.0.1:{proxy.port}"


def slow_answer(fp: FakeProvider, words: int = 600) -> None:
    fp.add_turn(*[step for i in range(words) for step in (s.text(f"w{i} "), s.delay(0.05))])


def start_run(base: str) -> Tuple[requests.Response, str, int]:
    """A run started through the proxy: its response (a few frames read), its id, its producer's pid."""
    resp = requests.post(f"{base}/v1/chat/stream", json={"messages": [{"role": "user", "content": "go"}]},
                         stream=True, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp, resp.headers["X-Run-Id"], int(resp.headers["X-Worker-Pid"])


def follower(base: str, run_id: str, pid: int) -> Tuple[List[RunEvent], threading.Thread, List[float]]:
    """A RunClient following the run from the other worker, in a thread; its events and when each came."""
    events: List[RunEvent] = []
    times: List[float] = []
    client = RunClient(base, timeout_s=30)

    def follow() -> None:
        for event in client.follow(run_id):
            events.append(event)
            times.append(time.monotonic())
        client.close()

    thread = threading.Thread(target=follow, name="test-follower", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.02)
    assert events, "the follower got nothing"
    return events, thread, times


def terminal_after(events: List[RunEvent], times: List[float], since: float, limit_s: float) -> RunEvent:
    deadline = since + limit_s + 5
    while time.monotonic() < deadline and not (events and events[-1].terminal):
        time.sleep(0.02)
    assert events and events[-1].terminal, events[-3:]
    assert times[-1] - since <= limit_s, f"terminal after {times[-1] - since:.2f}s"
    return events[-1]


def test_kill_9_of_the_producing_worker_is_producer_lost_within_the_lease(tmp_path, shared_logs):
    with FakeProvider() as fp:
        slow_answer(fp)
        with two_workers(tmp_path, fp, shared_logs.spec) as base:
            resp, run_id, pid = start_run(base)
            events, thread, times = follower(base, run_id, pid)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            last = terminal_after(events, times, killed, LEASE_S + 1)
            assert last.event == "error" and last.json()["code"] == "producer_lost"
            seqs = [int(e.id.rpartition(".")[2]) for e in events]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            thread.join(10)
            resp.close()
            status = RunClient(base).status(run_id)
            assert status["state"] == "lost"


def test_a_frozen_producer_is_fenced_after_producer_lost_and_writes_nothing_after_it(tmp_path, shared_logs):
    with FakeProvider() as fp:
        slow_answer(fp)
        with two_workers(tmp_path, fp, shared_logs.spec) as base:
            resp, run_id, pid = start_run(base)
            events, thread, times = follower(base, run_id, pid)
            frozen = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            try:
                last = terminal_after(events, times, frozen, LEASE_S + 1)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert last.json()["code"] == "producer_lost"
            # Revived, the producer is fenced: it cancels its run (the provider sees it go) and the
            # client it still serves gets the same terminal from the log, nothing after it.
            assert fp.wait_for_client_disconnects(1, timeout=10)
            own = [json.loads(line[6:]) for line in resp.iter_lines(decode_unicode=True)
                   if line.startswith("data: ") and line != "data: [DONE]"]
            assert own[-1]["code"] == "producer_lost"
            thread.join(10)
            with open_log(shared_logs.spec) as log:
                status = log.status(run_id, "anonymous")
                assert status.state == "lost" and status.terminal.seq == status.last_seq
                assert int(last.id.rpartition(".")[2]) == status.last_seq


def test_sigterm_ends_the_workers_runs_with_worker_shutdown_not_a_lost_lease(tmp_path, shared_logs):
    with FakeProvider() as fp:
        slow_answer(fp)
        with two_workers(tmp_path, fp, shared_logs.spec) as base:
            resp, run_id, pid = start_run(base)
            events, thread, times = follower(base, run_id, pid)
            asked = time.monotonic()
            os.kill(pid, signal.SIGTERM)
            last = terminal_after(events, times, asked, LEASE_S)  # before any lease could run out
            assert last.event == "error" and last.json()["code"] == "worker_shutdown"
            thread.join(10)
            resp.close()


def test_a_run_resumed_on_another_worker_is_stopped_from_any_worker(tmp_path, shared_logs):
    with FakeProvider() as fp:
        slow_answer(fp)
        with two_workers(tmp_path, fp, shared_logs.spec) as base:
            resp, run_id, pid = start_run(base)
            first = next(line for line in resp.iter_lines(decode_unicode=True) if line.startswith("id: "))
            resp.close()  # the client drops; its run goes on detached on its worker
            events, thread, times = follower(base, run_id, pid)  # resumed on the other worker
            assert int(events[0].id.rpartition(".")[2]) == 1 and first == f"id: {run_id}.1"
            asked = time.monotonic()
            stopped = requests.post(f"{base}/v1/runs/{run_id}/stop", timeout=10)
            assert stopped.status_code == 202
            last = terminal_after(events, times, asked, 3.0)
            assert last.event == "done" and last.json()["cancel_reason"] == "stopped"
            assert fp.wait_for_client_disconnects(1, timeout=10)  # the producer's provider call was cancelled
            thread.join(10)
