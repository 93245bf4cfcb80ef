"""``streamengine serve`` on SIGTERM stops like on Ctrl-C: it closes the engine and its MCP servers.

SIGTERM is how ``kill``, ``docker stop`` and systemd stop a server.  Its
default action ends the process on the spot, so nothing closed the stdio MCP
servers, and one that does not exit when its stdin closes (EOF) ran on.
The server here is such a one: the lab server, which then sleeps.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import wait_for
from mcp_servers.support import LAB, process_gone

from streamengine.testing import FakeProvider

pytest.importorskip("mcp", reason="the MCP SDK is in the test extra: pip install -e '.[test]'")
ROOT = Path(__file__).resolve().parents[2]

#: The lab MCP server over stdio, writing its pid first; after EOF on stdin it sleeps instead of exiting.
DEAF_SERVER = textwrap.dedent("""
    import os, runpy, sys, time
    with open(sys.argv[1], "w") as out:
        out.write(str(os.getpid()))
    sys.argv = [sys.argv[2], "stdio", sys.argv[3]]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        time.sleep(600)
""")


def test_sigterm_stops_serve_and_closes_an_mcp_server_that_ignores_eof(tmp_path):
    script, pid_file = tmp_path / "deaf_server.py", tmp_path / "mcp.pid"
    script.write_text(DEAF_SERVER)
    mcp_command = shlex.join([sys.executable, str(script), str(pid_file), LAB, str(tmp_path / "record.jsonl")])
    with FakeProvider() as fp:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        serve = subprocess.Popen([sys.executable, "-m", "streamengine", "serve", "--port", "0", "-m", "m",
                                  "--base-url", fp.base_url, "--mcp", mcp_command],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        mcp_pid = None
        try:
            first = serve.stdout.readline()
            assert "serving on" in first, first + serve.stderr.read()
            assert wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=10)
            mcp_pid = int(pid_file.read_text())
            serve.send_signal(signal.SIGTERM)
            out, err = serve.communicate(timeout=30)
            assert wait_for(lambda: process_gone(mcp_pid), timeout=15), "the MCP server outlived serve"
            assert serve.returncode == 0 and "stopped" in out, (serve.returncode, err)
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.wait(10)
            if mcp_pid is not None and not process_gone(mcp_pid):
                os.kill(mcp_pid, signal.SIGKILL)
                time.sleep(0.1)
