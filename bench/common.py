"""Shared pieces of the benchmarks: the server process, OpenAI frames, statistics."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ID = '"id":"chatcmpl-bench0123456789","object":"chat.completion.chunk","created":1700000000,' \
      '"model":"bench-model","system_fingerprint":"fp_bench01",'


def sse(data: str) -> str:
    return "data: " + data + "\n\n"


def content_frame(text: str) -> str:
    """A realistic OpenAI content chunk (about 220 bytes, like api.openai.com's)."""
    return sse("{" + _ID + '"choices":[{"index":0,"delta":{"content":' + json.dumps(text)
               + '},"logprobs":null,"finish_reason":null}]}')


def finish_frames() -> str:
    """finish_reason, then the usage-only frame, then [DONE]."""
    return (sse("{" + _ID + '"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}')
            + sse("{" + _ID + '"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":100,'
                  '"total_tokens":110}}')
            + sse("[DONE]"))


def seg(data: str, repeat: int = 1, delay: float = 0.0, mark: Optional[str] = None) -> Dict[str, Any]:
    out: Dict[str, Any] = {"data": data, "repeat": repeat}
    if delay:
        out["delay"] = delay
    if mark is not None:
        out["mark"] = mark
    return out


class Server:
    """The pre-rendered server (bench/server.py) in a child process."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.server"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"bench server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = self.root + "/v1"

    def script(self, name: str, segments: List[Dict[str, Any]],
               followup: Optional[List[Dict[str, Any]]] = None) -> str:
        body = json.dumps({"name": name, "segments": segments, "followup": followup}).encode()
        req = urllib.request.Request(self.root + "/_script", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as resp:
            resp.read()
        return name

    def marks(self, clear: bool = True) -> List[tuple]:
        with urllib.request.urlopen(self.root + "/_marks" + ("?clear=1" if clear else "")) as resp:
            return [tuple(m) for m in json.loads(resp.read())["marks"]]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def quiet_logs() -> None:
    """The library is silent unless enabled; make sure nothing else prints on the hot path."""
    try:
        from loguru import logger
        logger.disable("streamengine")
    except ImportError:  # pragma: no cover
        pass


def post_raw(port: int, path: str, payload: Any, accept: str = "text/event-stream"):
    """Open a socket, send one JSON POST (Connection: close); return the socket."""
    import socket
    body = json.dumps(payload).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Accept: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                 % (path.encode(), accept.encode(), len(body)) + body)
    return sock


def chunked_lines(sock: Any) -> Any:
    """Yield, per ``recv``, the list of complete lines of a chunked (or close-delimited) body.

    A minimal HTTP/1.1 chunked decoder: one generator step per read, not per
    line, so the reader adds next to nothing to what it measures.
    """
    recv = sock.recv
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = recv(65536)
        if not data:
            return
        buf += data
    head, buf = buf.split(b"\r\n\r\n", 1)
    chunked = b"transfer-encoding: chunked" in head.lower()
    pending = b""
    remaining = 0
    while True:
        if not chunked:
            data, buf = (buf or recv(65536)), b""
            if not data:
                if pending:
                    yield [pending]
                return
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            yield lines
            continue
        if remaining == 0:
            while b"\r\n" not in buf:
                data = recv(65536)
                if not data:
                    return
                buf += data
            line, buf = buf.split(b"\r\n", 1)
            remaining = int(line.split(b";", 1)[0], 16)
            if remaining == 0:
                if pending:
                    yield [pending]
                return
        while not buf:
            buf = recv(65536)
            if not buf:
                return
        take, buf = buf[:remaining], buf[remaining:]
        remaining -= len(take)
        if remaining == 0:
            while len(buf) < 2:
                data = recv(65536)
                if not data:
                    break
                buf += data
            buf = buf[2:]
        lines = (pending + take).split(b"\n")
        pending = lines.pop()
        yield lines


def machine_cpu_s() -> float:
    """CPU seconds processes have used since boot, plus time stolen by the hypervisor.

    From /proc/stat: user + nice + system + steal.  Interrupt time is left
    out: loopback traffic is handled there, and that is the benchmark's own.
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system = fields[0], fields[1], fields[2]
    steal = fields[7] if len(fields) > 7 else 0
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
