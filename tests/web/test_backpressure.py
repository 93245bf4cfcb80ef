"""A client that reads nothing cannot grow the server: bounded channel, TCP backpressure, stuck readers.

The app runs in its own process (waitress), so its memory is measured alone
(``VmHWM``, the peak resident set, from ``/proc``).  The model answers 60 MB
in 1 kB tokens; the client sends its question and then reads nothing.  The
run must stop reading the provider (the provider never gets far), the peak
memory must stay far below the answer's size, and ``stuck_reader_timeout_s``
must cancel the run, which closes the provider connection: the event the
test waits for.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import List

import pytest
from conftest import wait_for

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "x" * 1023 + "\n"
TOKENS = 60 * 1024  # 60 MB
MARK_EVERY = 256    # a progress mark every 256 kB the provider wrote

SERVER = textwrap.dedent("""
    import sys, waitress
    from streamengine import enable_logging
    from streamengine import OpenAICompatibleClient
    from streamengine import EngineConfig, StreamingEngine
    from streamengine.wsgi import make_wsgi_app

    # The output caps above the 60 MB answer: what is tested here is backpressure, not the caps.
    engine = StreamingEngine(OpenAICompatibleClient(sys.argv[1]), [],
                             EngineConfig(models=["m"], idle_timeout=60, completion_timeout=120,
                                          max_answer_chars=10**8, max_run_output_chars=10**8))
    app = make_wsgi_app(engine, stuck_reader_timeout_s=float(sys.argv[2]), heartbeat_s=1.0)
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=4, channel_request_lookahead=1,
                                    outbuf_high_watermark=int(sys.argv[3]))
    enable_logging("WARNING")  # the stuck-reader cancel is logged: the test waits for that line
    print(server.effective_port, flush=True)
    server.run()
""")


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def ask(port: int) -> socket.socket:
    body = json.dumps({"messages": [{"role": "user", "content": "write a lot"}]}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # a small window, like a slow phone
    sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from /proc")
@pytest.mark.parametrize("high_watermark_mb", [1, 16], ids=["outbuf-1MB", "waitress-default-16MB"])
def test_a_client_that_reads_nothing_holds_bounded_memory_and_is_cancelled(high_watermark_mb):
    marks: List[threading.Event] = [threading.Event() for _ in range(TOKENS // MARK_EVERY)]
    steps = []
    for mark in marks:
        steps += [s.text(TOKEN)] * MARK_EVERY + [s.signal(mark)]
    with FakeProvider() as fp:
        fp.add_turn(s.text("warm"))
        fp.add_turn(*steps)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-c", SERVER, fp.base_url, "3", str(high_watermark_mb << 20)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        try:
            port = int(proc.stdout.readline())
            warm = ask(port)  # one whole run first: imports and pools are in the baseline
            received = b""
            while b"data: [DONE]" not in received[-100:]:
                received += warm.recv(65536)
            warm.close()
            baseline_kb = rss_kb(proc.pid, "VmHWM")
            conn = f"FakeProvider-{fp.port}-conn"
            connections = lambda: len([t for t in threading.enumerate() if t.name == conn])  # noqa: E731
            idle = connections()  # the warm run's connection may stay pooled
            slow = ask(port)
            assert fp.wait_for_requests(2, timeout=30)
            # The run is cancelled by the stuck-reader timeout (3 s), then its provider connection closes.
            cancelled = next((line for line in proc.stderr if "cancelling its run" in line), "")
            assert "stuck_reader_timeout_s=3.0" in cancelled, "the stuck reader was never cancelled"
            assert wait_for(lambda: connections() <= idle, timeout=30), "the provider connection stayed open"
            peak_kb = rss_kb(proc.pid, "VmHWM")
            sent_mb = sum(m.is_set() for m in marks) * MARK_EVERY * len(TOKEN) / 1e6
            slow.close()
        finally:
            proc.terminate()
            proc.wait(10)
    growth_mb = (peak_kb - baseline_kb) / 1024
    print(f"outbuf_high_watermark {high_watermark_mb} MB: provider sent {sent_mb:.0f} of "
          f"{TOKENS * len(TOKEN) / 1e6:.0f} MB; server peak grew {growth_mb:.1f} MB over {baseline_kb / 1024:.0f} MB")
    assert sent_mb < 40, "the run kept reading the provider: no backpressure"
    # The run keeps the text it delivered (the answer so far), so the bound follows what the server and the
    # kernel buffer for the socket: waitress's outbuf_high_watermark plus a few MB of socket buffers.
    bound_mb = 40 + 4 * high_watermark_mb
    assert growth_mb < bound_mb, f"memory grew {growth_mb:.0f} MB for one slow reader (bound {bound_mb} MB)"
