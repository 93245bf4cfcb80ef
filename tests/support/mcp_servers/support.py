"""Start the lab server (HTTP or stdio), find the reference servers, read what the lab server recorded."""
from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

LAB = str(Path(__file__).with_name("lab.py"))


def server_command(name: str) -> str:
    """The reference server's console script in this venv; missing fails under CI, skips elsewhere."""
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if found is None:
        message = f"{name} is not installed: pip install -e '.[test]' (setup.cfg's test extra has it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


class Record:
    """The JSON lines the lab server appends for ``slow`` and ``plain`` calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def events(self) -> List[Dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def has(self, event: str, tag: str) -> bool:
        return any(e["event"] == event and e["tag"] == tag for e in self.events())

    def when(self, event: str, tag: str) -> Optional[float]:
        return next((e["t"] for e in self.events() if e["event"] == event and e["tag"] == tag), None)

    def wait(self, event: str, tag: str, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.has(event, tag):
                return True
            time.sleep(0.01)
        return self.has(event, tag)

    def watch(self, event: str, tag: str, timeout: float = 20.0) -> threading.Event:
        """An Event set once the server recorded ``event`` for ``tag`` (a FakeProvider can wait on it)."""
        seen = threading.Event()

        def poll() -> None:
            if self.wait(event, tag, timeout):
                seen.set()

        threading.Thread(target=poll, name="pytest-mcp-record-watch", daemon=True).start()
        return seen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, gone: Any, stop: Any, what: str) -> None:
    """Return once 127.0.0.1:``port`` accepts; raise (after ``stop()``) if the server died or took 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if gone():
            raise RuntimeError(f"{what} exited before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    stop()
    raise RuntimeError(f"{what} did not listen within 30 s")


class _LabForks:
    """This process's ``lab.py forks``: it has imported the MCP SDK once and forks each HTTP lab server.

    Started on first use; it ends when this process does (its stdin closes).
    """

    process: Optional[subprocess.Popen] = None

    @classmethod
    def fork(cls, port: int, record: Path) -> int:
        """Start a lab server on ``port`` recording to ``record``; its pid."""
        if cls.process is None or cls.process.poll() is not None:
            cls.process = subprocess.Popen([sys.executable, LAB, "forks"], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            atexit.register(cls.process.wait, 10)
            atexit.register(cls.process.stdin.close)  # atexit runs last-registered first
        cls.process.stdin.write(json.dumps({"port": port, "record": str(record)}) + "\n")
        cls.process.stdin.flush()
        reply = cls.process.stdout.readline()
        if not reply.strip():
            raise RuntimeError(f"the lab MCP fork server exited with status {cls.process.wait(10)}")
        return int(reply)


class _OnAPort:
    def __init__(self, record: Record) -> None:
        self.record = record
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"


class LabHttp(_OnAPort):
    """The lab server over streamable HTTP on 127.0.0.1, a process of its own (forked by _LabForks)."""

    def __init__(self, record: Record) -> None:
        super().__init__(record)
        self.pid = _LabForks.fork(self.port, record.path)
        wait_listening(self.port, lambda: process_gone(self.pid), self.stop, "the lab MCP server")

    def kill(self) -> None:
        """SIGKILL: the server goes down at once, mid-call if one is running."""
        self._signal_and_wait(signal.SIGKILL, 10)

    def stop(self) -> None:
        if not self._signal_and_wait(signal.SIGTERM, 10):
            self.kill()

    def _signal_and_wait(self, signum: int, timeout: float) -> bool:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + timeout
        while not process_gone(self.pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def lab_stdio_args(record: Record) -> List[str]:
    return [sys.executable, LAB, "stdio", str(record.path)]


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie still answers kill(0); its state says it is dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True
    return False


@pytest.fixture
def record(tmp_path: Path) -> Record:
    return Record(tmp_path / "lab-record.jsonl")


@pytest.fixture
def lab_http(record: Record):
    server = LabHttp(record)
    try:
        yield server
    finally:
        server.stop()


#: The name of the one thread whose event loop serves every MCP server of the process.
MCP_LOOP_THREAD = "streamengine-mcp-loop"


def mcp_loop_threads() -> List[threading.Thread]:
    """The MCP loop's thread while it runs: none once the last server is closed."""
    return [thread for thread in threading.enumerate() if thread.name == MCP_LOOP_THREAD and thread.is_alive()]


def mcp_loop() -> asyncio.AbstractEventLoop:
    """The event loop the MCP servers share: the one event loop running in this test process."""
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]
    assert len(loops) == 1, f"expected the MCP loop alone to run, found {loops}"
    return loops[0]


@pytest.fixture
def no_mcp_leak():
    """After the test: no MCP loop thread, and every server process it started is gone."""
    yield
    deadline = time.monotonic() + 10
    while mcp_loop_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not mcp_loop_threads(), "the MCP loop thread outlived every server"


HOSTILE = str(Path(__file__).with_name("hostile.py"))


def hostile_stdio_args(record: Record, *flags: str) -> List[str]:
    return [sys.executable, HOSTILE, "stdio", str(record.path), *flags]


class HostileHttp(_OnAPort):
    """The hostile server over streamable HTTP on 127.0.0.1, a process of its own."""

    def __init__(self, record: Record) -> None:
        super().__init__(record)
        self.process = subprocess.Popen([sys.executable, HOSTILE, "http", str(self.port), str(record.path)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        wait_listening(self.port, lambda: self.process.poll() is not None, self.stop, "the hostile MCP server")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def hostile_http(record: Record):
    server = HostileHttp(record)
    try:
        yield server
    finally:
        server.stop()
