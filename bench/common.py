"""Shared pieces of the benchmarks: the server process, OpenAI frames, statistics."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
    """The pre-rendered server (bench/server.py), or another upstream module, in a child process."""

    def __init__(self, module: str = "bench.server") -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env,
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

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100.0 * len(ordered) + 0.5) - 1))
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


def chunked_payloads(sock: Any) -> Any:
    """Yield, per ``recv``, the body bytes it brought (HTTP/1.1 chunked or close-delimited).

    A minimal decoder: one generator step per read, so the reader adds next to
    nothing to what it measures.
    """
    recv = sock.recv
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = recv(65536)
        if not data:
            return
        buf += data
    head, buf = buf.split(b"\r\n\r\n", 1)
    if b"transfer-encoding: chunked" not in head.lower():
        while True:
            data, buf = (buf or recv(65536)), b""
            if not data:
                return
            yield data
    remaining = 0
    while True:
        if remaining == 0:
            while b"\r\n" not in buf:
                data = recv(65536)
                if not data:
                    return
                buf += data
            line, buf = buf.split(b"\r\n", 1)
            remaining = int(line.split(b";", 1)[0], 16)
            if remaining == 0:
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
        yield take


def chunked_lines(sock: Any) -> Any:
    """Yield, per ``recv``, the list of complete lines (bytes) the body has so far."""
    pending = b""
    for data in chunked_payloads(sock):
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        yield lines
    if pending:
        yield [pending]


def answer_of(datas: Any) -> str:
    """The answer text from a stream's SSE ``data`` strings (what a peer's SSE parser yields)."""
    parts: List[str] = []
    for data in datas:
        if data == "[DONE]":
            break
        choices = json.loads(data)["choices"]
        if choices:
            content = choices[0]["delta"].get("content")
            if content:
                parts.append(content)
    return "".join(parts)


def run_together(jobs: Sequence[Any], what: str, timeout_s: float = 120.0) -> None:
    """Run each callable in its own thread, all at once; re-raise the first failure; never wait forever."""
    import threading
    failures: List[BaseException] = []

    def guarded(job: Any) -> None:
        try:
            job()
        except BaseException as exc:  # re-raised below, in the caller's thread
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(job,), name=f"bench-{what}-{i}") for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise RuntimeError(f"{what}: {t.name} did not finish in {timeout_s:.0f} s; the engine is stuck")
    if failures:
        raise RuntimeError(f"{what}: a concurrent run failed: {failures[0]!r}") from failures[0]


def announce_and_serve(port: int, serve: Any) -> None:
    """Print ``PORT <n>`` for the parent, exit when its stdin closes (never outlive the bench), serve."""
    import threading
    sys.stdout.write(f"PORT {port}\n")
    sys.stdout.flush()

    def stop_when_stdin_closes() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    serve()


def raw_read(port: int, model: str, messages: Any, decoder: str = "scan_once") -> Tuple[str, int]:
    """The fastest pure-Python reader we can write: (answer text, number of reads).

    A socket, the chunked decoder above, one ``decode`` and one ``split`` per
    read, and ``JSONDecoder.scan_once`` per frame (the C scanner without
    ``json.loads``' Python frames, as our client does).  ``decoder="loads"``
    is the same reader with ``json.loads``, the figure earlier runs used.
    """
    sock = post_raw(port, "/v1/chat/completions", {"model": model, "messages": messages, "stream": True})
    scan = json.JSONDecoder().scan_once
    loads = json.loads
    use_scan = decoder == "scan_once"
    parts: List[str] = []
    pending = b""
    reads = 0
    try:
        for data in chunked_payloads(sock):
            reads += 1
            complete, _, pending = (pending + data).rpartition(b"\n")
            if not complete:
                continue
            for line in complete.decode("utf-8").split("\n"):
                if line[:6] != "data: ":
                    continue
                if line == "data: [DONE]":
                    return "".join(parts), reads
                frame = scan(line, 6)[0] if use_scan else loads(line[6:])
                choices = frame["choices"]
                if choices:
                    content = choices[0]["delta"].get("content")
                    if content:
                        parts.append(content)
        return "".join(parts), reads
    finally:
        sock.close()


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
    return sum(process_cpu_split(pid))


def process_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one process ((0, 0) if it is gone): what is in the kernel's share."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


# --- is the machine quiet enough to compare? ---------------------------------------------

BUSY_CORES = 0.2  # other processes' CPU (cores) above which a figure is not comparable


def other_cores(machine0: float, ours0: float, machine1: float, ours1: float, wall_s: float) -> float:
    """Cores other processes used over an interval: machine CPU minus our processes' CPU."""
    return max(0.0, (machine1 - machine0) - (ours1 - ours0)) / max(wall_s, 1e-9)


def spread(values: Sequence[float]) -> Dict[str, float]:
    """min / median / max of repeats, and how many."""
    return {"min": min(values), "median": median(values), "max": max(values), "n": len(values)}


def pid_status(pid: int) -> Dict[str, int]:
    """Threads and RSS (bytes) of one process, from /proc."""
    out = {"threads": 0, "rss": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    out["rss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def child_pids(pid: int) -> List[int]:
    """Direct children of a process (e.g. gunicorn's workers)."""
    out: List[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out
