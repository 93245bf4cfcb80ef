"""Under a real ``serve`` (waitress): a client that stops reading, and one that goes away, free what they held.

* **A stuck reader** (its receive window shrinks to nothing; its kernel
  still ACKs the zero-window probes) leaves the server's thread blocked in
  waitress's write once the output buffer is full.  After
  ``stuck_reader_timeout_s`` its run is cancelled *and* its connection is
  closed, so the thread and the client's stream slot are free again.
* **A closed browser** during a silent phase (a tool runs, the model writes
  nothing) is noticed by waitress's disconnect probe, well before the next
  heartbeat would fail a write: the tool is cancelled at once.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import List

import pytest
import requests
import sseclient
from conftest import wait_for
from loguru import logger
from serve_support import served
from wsgi_support import block, read1_pieces, sse, tokens_of

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

STUCK_TIMEOUT_S = 2.0  # long enough that the four streams are all open before the first is given up
TOKEN = "x" * 1023 + "\n"
#: 32 MB an answer: far more than waitress's output buffer and the kernel's socket buffers hold.
TOKENS = 32 * 1024
STREAMS_PER_CLIENT = 4  # the app's default max_streams_per_client


@pytest.fixture
def stuck_warnings():
    """The monotonic times at which the app logged a stuck reader's cancel."""
    times: List[float] = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: times.append(time.monotonic()), level="WARNING",
                         filter=lambda r: r["name"].startswith("streamengine") and "read nothing" in r["message"])
    yield times
    logger.remove(handler)
    logger.disable("streamengine")


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def ask_then_read_nothing(port: int) -> socket.socket:
    """A stream whose client never reads: a tiny receive window, set before connecting so it holds."""
    body = json.dumps({"messages": [{"role": "user", "content": "write a lot"}]}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def every_stream_slot_is_free(fp: FakeProvider, url: str) -> bool:
    """True when one client's ``STREAMS_PER_CLIENT`` streams are all served at once: no earlier stream holds a slot.

    What the app's ``active_streams == 0`` says, asked as a client sees it (``serve`` keeps its app to itself).
    """
    release = threading.Event()
    fp.respond_with(lambda request: [s.text("held"), s.wait(release, timeout=30)])
    held: List[requests.Response] = []
    try:
        for _ in range(STREAMS_PER_CLIENT):
            held.append(post(url))
        return all(resp.status_code == 200 for resp in held)
    finally:
        release.set()
        for resp in held:
            resp.close()
        fp.respond_with(None)


def ends(sock: socket.socket) -> bool:
    """Read what the socket still holds: True when the server closed the connection (end or reset)."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def post(url: str) -> requests.Response:
    return requests.post(f"{url}/v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}]},
                         stream=True, timeout=10)


def test_a_stuck_reader_loses_its_connection_and_its_slot_after_the_timeout(stuck_warnings):
    big = [s.text(TOKEN)] * TOKENS
    with FakeProvider() as fp:
        for _ in range(STREAMS_PER_CLIENT):
            fp.add_turn(*big)
        fp.add_turn(s.text("fresh"))
        config = EngineConfig(models=["m"], idle_timeout=30.0, completion_timeout=120.0,
                              max_answer_chars=10 ** 9, max_run_output_chars=10 ** 9)
        # As many streams as the app's default allows: only the client's own cap refuses the fifth.
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [], config) as engine, \
                served(engine, stuck_reader_timeout_s=STUCK_TIMEOUT_S, heartbeat_s=5.0, max_streams=32) as url:
            stuck = [ask_then_read_nothing(port_of(url)) for _ in range(STREAMS_PER_CLIENT)]
            try:
                assert fp.wait_for_requests(STREAMS_PER_CLIENT, timeout=10)  # every stuck stream's run began
                with post(url) as refused:  # the client's every stream slot is taken
                    assert refused.status_code == 429
                assert wait_for(lambda: len(stuck_warnings) >= STREAMS_PER_CLIENT, timeout=60), \
                    "the stuck readers were never cancelled"
                cancelled_at = max(stuck_warnings)
                status = 429
                while status == 429 and time.monotonic() < cancelled_at + 5:
                    with post(url) as fresh:
                        status = fresh.status_code
                        events = sse(fresh) if status == 200 else []
                    time.sleep(0.05)
                assert status == 200, "the stuck readers kept their stream slots"
                assert tokens_of(events) == ["fresh"]
                assert all(ends(sock) for sock in stuck), "a stuck reader's connection stayed open"
                assert wait_for(lambda: every_stream_slot_is_free(fp, url))
            finally:
                for sock in stuck:
                    sock.close()


def test_a_closed_browser_cancels_a_running_tool_during_a_silent_phase_before_any_heartbeat():
    """Only waitress's disconnect probe can notice it: no write happens until the heartbeat (30 s)."""
    heartbeat_s = 30.0
    running, cancelled = threading.Event(), threading.Event()

    @tool
    def survey(ctx: ToolContext) -> str:
        """Takes long unless cancelled."""
        running.set()
        if ctx.cancel_event.wait(60):
            cancelled.set()
        return "late"

    silence = threading.Event()
    with FakeProvider() as fp:
        fp.add_turn(s.text("Looking. "), s.text(block("survey")), s.wait(silence, timeout=60), s.text("never"))
        config = EngineConfig(models=["m"], idle_timeout=90.0, completion_timeout=120.0, tool_timeout=90.0)
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [survey], config) as engine, \
                served(engine, heartbeat_s=heartbeat_s, max_streams=32) as url:
            try:
                resp = post(url)
                for event in sseclient.SSEClient(read1_pieces(resp)).events():
                    if event.event == "tool_start":
                        break
                assert running.wait(10)
                resp.close()  # the tab is closed while the tool runs and the model is silent
                # Far below the heartbeat: a failed write cannot be what noticed it.
                assert cancelled.wait(heartbeat_s / 3), "the closed browser's tool was not cancelled"
                assert wait_for(lambda: every_stream_slot_is_free(fp, url))
            finally:
                silence.set()


GUNICORN_APP = """
import os
from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.wsgi import make_wsgi_app

engine = StreamingEngine(OpenAICompatibleClient(os.environ["SE_PROVIDER"]), [],
                         EngineConfig(models=["m"], idle_timeout=30, completion_timeout=120,
                                      max_answer_chars=10 ** 9, max_run_output_chars=10 ** 9))
app = make_wsgi_app(engine, stuck_reader_timeout_s=1.0, heartbeat_s=5.0, max_streams_per_client=1)
"""


def test_under_gunicorn_a_stuck_reader_loses_its_connection_and_its_slot(tmp_path):
    pytest.importorskip("gunicorn", reason="gunicorn is in the test extra: pip install -e '.[test]'")
    from test_gunicorn import gunicorn_serving

    with FakeProvider() as fp:
        fp.add_turn(*[s.text(TOKEN)] * TOKENS)
        fp.add_turn(s.text("fresh"))
        with gunicorn_serving(fp.base_url, tmp_path, app_source=GUNICORN_APP) as url:
            stuck = ask_then_read_nothing(port_of(url))
            try:
                assert fp.wait_for_requests(1, timeout=10)
                status = 429
                deadline = time.monotonic() + 30  # the buffers fill, then 1 s stuck, then the reset
                while status == 429 and time.monotonic() < deadline:
                    with post(url) as fresh:
                        status = fresh.status_code
                        events = sse(fresh) if status == 200 else []
                    time.sleep(0.1)
                assert status == 200, "the stuck reader kept its stream slot"
                assert tokens_of(events) == ["fresh"] and ends(stuck)
            finally:
                stuck.close()
