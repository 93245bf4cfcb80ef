"""The app under a real gunicorn (gthread worker), like under waitress: stream, limits, disconnect cancels.

gunicorn runs as its own process with the app module below; the model is a
FakeProvider in the test process, so "the run was cancelled" is observed as
the provider connection closing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import requests
import sseclient
from conftest import wait_for
from wsgi_support import STREAM_ACCEPT, read1_pieces

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")
gunicorn = pytest.importorskip("gunicorn", reason="gunicorn is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
APP = textwrap.dedent("""
    import os
    from streamengine import OpenAICompatibleClient
    from streamengine import EngineConfig, StreamingEngine
    from streamengine.wsgi import make_wsgi_app

    engine = StreamingEngine(OpenAICompatibleClient(os.environ["SE_PROVIDER"]), [],
                             EngineConfig(models=["m"], idle_timeout=30, completion_timeout=60))
    app = make_wsgi_app(engine, heartbeat_s=0.2, max_streams=2, max_streams_per_client=2)
""")


@contextmanager
def gunicorn_serving(provider_url: str, tmp_path: Path, threads: int = 3, app_source: str = APP) -> Iterator[str]:
    (tmp_path / "se_app.py").write_text(app_source)
    env = dict(os.environ, SE_PROVIDER=provider_url, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
                             "--threads", str(threads), "--bind", "127.0.0.1:0", "--log-level", "info",
                             "se_app:app"], env=env, stderr=subprocess.PIPE, text=True)
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
        proc.wait(20)
        if "drain" in locals():
            drain.join(5)


def provider_connections(fp: FakeProvider) -> int:
    return len([t for t in threading.enumerate() if t.name == f"FakeProvider-{fp.port}-conn"])


def test_gunicorn_gthread_streams_and_a_disconnect_cancels_the_run(tmp_path):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello "), s.text("from gunicorn."))
        fp.add_turn(s.text("Working on it "), s.stall())  # held open until the client goes away
        with gunicorn_serving(fp.base_url, tmp_path) as url:
            assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
            with requests.post(f"{url}/v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}]},
                               stream=True, timeout=10) as resp:
                assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                events = [(e.event, e.data) for e in sseclient.SSEClient(read1_pieces(resp)).events()]
            tokens = [json.loads(d) for k, d in events if k == "message" and d != "[DONE]"]
            assert tokens == ["Hello ", "from gunicorn."] and events[-1] == ("message", "[DONE]")

            resp = requests.get(f"{url}/v1/chat/stream", params={"q": "stall"}, headers=STREAM_ACCEPT,
                                stream=True, timeout=10)
            for event in sseclient.SSEClient(read1_pieces(resp)).events():
                if event.data == json.dumps("Working on it "):
                    break
            assert fp.wait_for_requests(2) and provider_connections(fp) >= 1
            held = provider_connections(fp)
            resp.close()  # the tab is closed: gunicorn's next heartbeat write fails, the run is cancelled
            assert wait_for(lambda: provider_connections(fp) < held, timeout=15), "the run was not cancelled"


def test_gunicorn_limits_streams_and_keeps_health_answering(tmp_path):
    """threads=3, max_streams=2: two held streams, /healthz still answers, a third stream is a 429."""
    release = threading.Event()
    with FakeProvider() as fp:
        for _ in range(2):
            fp.add_turn(s.wait(release, timeout=20), s.text("ok"))
        with gunicorn_serving(fp.base_url, tmp_path, threads=3) as url:
            held = [requests.post(f"{url}/v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}]},
                                  stream=True, timeout=10) for _ in range(2)]
            try:
                assert fp.wait_for_requests(2, timeout=10)
                assert requests.get(f"{url}/healthz", timeout=10).status_code == 200
                refused = requests.post(f"{url}/v1/chat/stream", timeout=10,
                                        json={"messages": [{"role": "user", "content": "hi"}]})
                assert refused.status_code == 429 and refused.headers["Retry-After"] == "5"
            finally:
                release.set()
                for r in held:
                    assert r.text.rstrip().endswith("data: [DONE]")
                    r.close()
