"""7. Served, steady state: paced sessions arriving at a fixed rate, engine app against a relay.

Real traffic is not 200 sessions started at one instant (section 5): sessions
arrive one after another and overlap.  Here session ``i`` starts at
``i * duration / C``, so ``C`` sessions are open at any time once the first
ones end; each streams ``TOKENS`` tokens at ``RATE`` tokens/s from the paced
upstream (bench/upstream.py), every token its own frame and its own read.

Figures are taken in the steady window (from when the first sessions end to
the last arrival), never over a ramp or a drain:

* CPU per delivered token: the server process's CPU (all threads, user +
  system, gunicorn's master and worker) over the window / tokens the clients
  received in it;
* TTFT: request sent -> first token read, every session that started in the
  window; p99 needs >= 1,000 sessions and says so when it has fewer;
* lateness: when the client read a token minus when the upstream wrote it
  (each token carries its write time), every token read in the window;
* threads and RSS per open session: sampled every 100 ms, minus the same
  server idle after a warm-up, per session open at the sample; each open
  stream also holds one server worker thread (waitress pre-starts them; it is
  counted here).

The load generator is one ``selectors`` thread in the bench process; the
upstream is one in its own.  Baseline in the same run, under the same server, taking turns with
the engine app level by level (both processes stay up):
bench/served_app.py's relay (requests -> a WSGI generator, no engine).
"""
from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional

from .common import ROOT, Server, child_pids, machine_cpu_s, percentile, pid_status, process_cpu_s, process_cpu_split
from .served_app import CollectorClock

TOKENS = 60
RATE = 30.0  # tokens per second per session: a chat model as a user reads it
LEVELS = (10, 50, 100, 200)
KINDS = ("relay", "engine")
MIN_P99_SAMPLES = 1000
_REQUEST = json.dumps({"messages": [{"role": "user", "content": "go"}]}).encode()


class ServedApp:
    """``bench/served_app.py`` under waitress or gunicorn (gthread), in its own process."""

    def __init__(self, server: str, kind: str, upstream: str, model: str, threads: int,
                 runs_url: str = "") -> None:
        self.server = server
        self._gc_file = CollectorClock.new_file(f"bench-gc-{kind}-")
        self._runs_url = runs_url
        try:
            self._start(server, kind, upstream, model, threads)
        except BaseException:  # an app that did not come up is not left running
            proc = getattr(self, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            os.unlink(self._gc_file)
            raise

    def _start(self, server: str, kind: str, upstream: str, model: str, threads: int) -> None:
        env = dict(os.environ, BENCH_UPSTREAM=upstream, BENCH_MODEL=model, BENCH_APP=kind,
                   BENCH_GC_FILE=self._gc_file, BENCH_RUNS_URL=self._runs_url,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if server == "waitress":
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.served_app", str(threads)],
                                         cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = self.proc.stdout.readline()
            if not line.startswith("PORT "):
                raise RuntimeError(f"served app (waitress) did not start: {line!r}")
            self.port = int(line.split()[1])
        else:
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--threads", str(threads),
                 "--workers", "1", "--bind", f"127.0.0.1:{self.port}", "--backlog", "2048", "--timeout", "120",
                 "--graceful-timeout", "2", "--log-level", "warning", "bench.served_app:app"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as resp:
                    resp.read()
                return
            except OSError as exc:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"served app ({self.server}) did not answer /healthz: {exc}") from exc
                time.sleep(0.1)

    def pids(self) -> List[int]:
        return [self.proc.pid] + child_pids(self.proc.pid)

    def cpu_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.pids())

    def sys_cpu_s(self) -> float:
        """The kernel's share of :meth:`cpu_s` (system calls, the TCP stack, scheduling)."""
        return sum(process_cpu_split(pid)[1] for pid in self.pids())

    def gc_cpu_s(self) -> float:
        """CPU the app's garbage collector has taken so far (bench/served_app.py's ``CollectorClock``)."""
        return CollectorClock.read(self._gc_file)

    def status(self) -> Dict[str, int]:
        total = {"threads": 0, "rss": 0}
        for pid in self.pids():
            for key, value in pid_status(pid).items():
                total[key] += value
        return total

    def close(self) -> None:
        if self.server == "waitress":
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self._gc_file)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one client session, decoded incrementally in the load generator's loop ----------------

class Session:
    __slots__ = (
        "done",
        "end",
        "first",
        "head",
        "in_window",
        "left",
        "pending",
        "raw",
        "skip",
        "sock",
        "t0",
        "tokens",
    )

    def __init__(self, port: int, in_window: bool) -> None:
        self.in_window = in_window
        self.t0 = time.monotonic()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Accept: text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                          % len(_REQUEST) + _REQUEST)
        self.sock.setblocking(False)
        self.first: Optional[float] = None
        self.end: Optional[float] = None
        self.tokens = 0
        self.done = False
        self.raw, self.head, self.left, self.skip, self.pending = b"", False, 0, 0, b""

    def body(self, data: bytes) -> bytes:
        """HTTP/1.1 chunked decoding of what one read brought (the head is skipped)."""
        raw = self.raw + data
        if not self.head:
            i = raw.find(b"\r\n\r\n")
            if i < 0:
                self.raw = raw
                return b""
            raw, self.head = raw[i + 4:], True
        out = []
        while raw:
            if self.skip:
                cut = min(self.skip, len(raw))
                raw, self.skip = raw[cut:], self.skip - cut
                continue
            if self.left == 0:
                i = raw.find(b"\r\n")
                if i < 0:
                    break
                self.left = int(raw[:i].split(b";", 1)[0], 16)
                raw = raw[i + 2:]
                if self.left == 0:
                    raw = b""
                    break
            take, raw = raw[:self.left], raw[self.left:]
            self.left -= len(take)
            out.append(take)
            if self.left == 0:
                self.skip = 2
        self.raw = raw
        return b"".join(out)


class LoadRun:
    """Sessions started on a schedule and read in one thread; figures from the steady window."""

    def __init__(self, app: ServedApp, sessions: int, gap_s: float, window: tuple) -> None:
        self.app, self.n, self.gap = app, sessions, gap_s
        self.window = window  # (start, end) offsets from the first arrival
        self.sel = selectors.DefaultSelector()
        self.open: List[Session] = []
        self.finished: List[Session] = []
        self.lateness: List[float] = []
        self.window_tokens = 0
        self.samples: List[Dict[str, float]] = []
        self.snapshots: List[Dict[str, float]] = []

    def go(self, upstream_pid: int) -> None:
        t_start = time.monotonic() + 0.05
        w0, w1 = t_start + self.window[0], t_start + self.window[1]
        started = 0
        next_sample = w0
        while started < self.n or self.open:
            now = time.monotonic()
            due = t_start + started * self.gap if started < self.n else now + 1.0
            wake = next_sample if now < w1 or len(self.snapshots) < 2 else due
            timeout = max(0.0, min(due, wake) - now)
            for key, _ in self.sel.select(timeout):
                self._read(key.data, w0, w1)
            now = time.monotonic()
            while started < self.n and t_start + started * self.gap <= now:
                session = Session(self.app.port, w0 <= now <= w1)
                self.sel.register(session.sock, selectors.EVENT_READ, session)
                self.open.append(session)
                started += 1
            if w0 <= now and next_sample <= now and (now <= w1 or len(self.snapshots) < 2):
                self._sample(now, upstream_pid, last=now > w1)
                next_sample = max(next_sample + 0.1, now)  # a late loop samples less, not in a burst
            if time.monotonic() > t_start + self.n * self.gap + 60:
                for session in self.open:
                    session.sock.close()
                raise RuntimeError(f"served: {len(self.open)} sessions still open 60 s after the last arrival")

    def _sample(self, now: float, upstream_pid: int, last: bool) -> None:
        if not self.snapshots or last:
            self.snapshots.append({"t": now, "app_cpu": self.app.cpu_s(), "app_sys": self.app.sys_cpu_s(),
                                   "app_gc": self.app.gc_cpu_s(),
                                   "machine": machine_cpu_s(),
                                   "ours": time.process_time() + process_cpu_s(upstream_pid),
                                   "tokens": self.window_tokens})
            if last:
                return
        self.samples.append(dict(self.app.status(), open=len(self.open)))

    def _read(self, session: Session, w0: float, w1: float) -> None:
        try:
            data = session.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        now = time.monotonic()
        if not data:
            self.sel.unregister(session.sock)
            session.sock.close()
            session.end = now
            self.open.remove(session)
            self.finished.append(session)
            return
        complete, _, session.pending = (session.pending + session.body(data)).rpartition(b"\n")
        in_window = w0 <= now <= w1
        for line in complete.split(b"\n"):
            if line[:7] == b'data: "':
                session.tokens += 1
                if session.first is None:
                    session.first = now
                if in_window:
                    self.window_tokens += 1
                    self.lateness.append(now - float(line[9:-1]))
            elif line == b"data: [DONE]":
                session.done = True


def _level(app: ServedApp, upstream: Server, c: int, sessions: int, idle: Dict[str, int],
           tokens: int) -> Dict[str, Any]:
    duration = tokens / RATE
    gap = duration / c
    window = (duration + 0.2, (sessions - 1) * gap)
    _upstream_stats(upstream, clear=True)
    load = LoadRun(app, sessions, gap, window)
    load.go(upstream.proc.pid)
    lag = _upstream_stats(upstream, clear=True)
    a, b = load.snapshots[0], load.snapshots[-1]
    wall = b["t"] - a["t"]
    ttft = [s.first - s.t0 for s in load.finished if s.in_window and s.first is not None]
    complete = sum(1 for s in load.finished if s.done and s.tokens == tokens)
    per_session = [((p["threads"] - idle["threads"]) / p["open"], (p["rss"] - idle["rss"]) / p["open"])
                   for p in load.samples if p["open"]]
    other = max(0.0, (b["machine"] - a["machine"]) - (b["ours"] - a["ours"]) - (b["app_cpu"] - a["app_cpu"]))
    return {
        "sessions": sessions, "complete": complete, "window_s": wall, "window_tokens": b["tokens"] - a["tokens"],
        "cpu_per_token_us": (b["app_cpu"] - a["app_cpu"]) / max(1, b["tokens"] - a["tokens"]) * 1e6,
        "cpu_cores": (b["app_cpu"] - a["app_cpu"]) / wall,
        "sys_share": (b["app_sys"] - a["app_sys"]) / max(1e-9, b["app_cpu"] - a["app_cpu"]),
        "gc_share": (b["app_gc"] - a["app_gc"]) / max(1e-9, b["app_cpu"] - a["app_cpu"]),
        "ttft_n": len(ttft), "ttft_p50_ms": percentile(ttft, 50) * 1e3 if ttft else None,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3 if ttft else None,
        "lateness_n": len(load.lateness),
        "lateness_p99_ms": percentile(load.lateness, 99) * 1e3 if load.lateness else None,
        "open_mean": sum(p["open"] for p in load.samples) / max(1, len(load.samples)),
        # every open stream holds one server worker thread: waitress pre-started it (in idle), gthread
        # made it on demand (in the sample) during a level at least as high as any before
        "threads_per_session": sum(t for t, _ in per_session) / max(1, len(per_session))
        + (1.0 if app.server == "waitress" else 0.0),
        "rss_per_session": sum(r for _, r in per_session) / max(1, len(per_session)),
        "upstream_lag_p99_ms": lag.get("p99_ms"), "other_cores": other / wall,
    }


def _upstream_stats(upstream: Server, clear: bool) -> Dict[str, Any]:
    with urllib.request.urlopen(upstream.root + "/_stats" + ("?clear=1" if clear else "")) as resp:
        return json.loads(resp.read())


def _sessions_for(c: int, quick: bool, tokens: int) -> int:
    """The ramp's arrivals, then enough in the steady window: 1,000 (a real p99) at 200 sessions."""
    duration = tokens / RATE
    ramp = int(c * (duration + 0.2) / duration) + 1
    in_window = c if quick else (MIN_P99_SAMPLES if c >= 200 else c * 3)
    return ramp + in_window


def run(upstream: Server, quick: bool = False, levels: tuple = LEVELS,
        servers: tuple = ("waitress", "gunicorn"), tokens: int = TOKENS) -> Dict[str, Any]:
    model = f"paced:{tokens}:{RATE}:served:1"
    out: Dict[str, Any] = {"tokens": tokens, "rate": RATE, "levels": list(levels), "rows": {}}
    threads = max(levels) + 40
    for server in servers:
        # Both apps run side by side and take turns level by level: the machine's speed drifts over
        # minutes (CPU time per token moved by +-50% here), and a ratio of two figures taken far apart
        # would carry that drift.
        apps: Dict[str, ServedApp] = {}
        try:
            for kind in KINDS:
                apps[kind] = ServedApp(server, kind, upstream.base_url, model, threads)
            idle = {}
            for kind, app in apps.items():
                LoadRun(app, 2, 0.0, (0.0, 0.0)).go(upstream.proc.pid)  # imports, connections, code paths
                time.sleep(0.3)
                idle[kind] = app.status()
            rows: Dict[str, Dict[str, Any]] = {kind: {} for kind in KINDS}
            for c in levels:
                for kind, app in apps.items():
                    sessions = _sessions_for(c, quick, tokens)
                    rows[kind][str(c)] = _level(app, upstream, c, sessions, idle[kind], tokens)
            for kind in KINDS:
                out["rows"][f"{server}/{kind}"] = {"levels": rows[kind], "idle_threads": idle[kind]["threads"],
                                                      "idle_rss": idle[kind]["rss"]}
        finally:
            for app in apps.values():
                app.close()
    return out
