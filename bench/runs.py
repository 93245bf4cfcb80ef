"""16. Served runs in a log (issue 38): CPU per delivered token with each run log against ``runs=None``.

The engine app of section 7 (bench/served_app.py) under waitress, once
without a log and once with each of ``memory:``, SQLite (a file in a temporary
directory), Redis and PostgreSQL (from ``STREAMENGINE_TEST_REDIS_URL`` and
``STREAMENGINE_TEST_PG_DSN``, as ``scripts/test`` starts them; a log whose
server is not there is left out and says so).  All apps stay up and take
turns level by level, like section 7's, so the machine's drift does not land
on one of them.  Same paced load: each session streams ``TOKENS`` tokens at
``RATE`` tokens/s, every token its own upstream read.

Per level and log: CPU per delivered token (the app process's CPU over the
steady window / tokens delivered in it), its ratio to ``runs=None``, the
p99 lateness of a token (read time minus the upstream's write time: what
the log and the coalescing window add), and TTFT p50.  Then, per log, the
time from a reconnect (``GET /v1/runs/<id>/events`` with a Last-Event-ID in
the middle of a run its client left after 5 frames) to its first frame, p50 and p99 over
``RECONNECTS`` reconnects; and, per shared log, the time from ``kill -9`` of
the worker producing a run (gunicorn, one worker) to a reader's
``error{producer_lost}`` with ``take_over=False`` (target: within the lease + 1 s), and to the
``reset`` of the worker that took the run over (the default).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

from .common import Server, child_pids, percentile
from .served import LoadRun, ServedApp, _level, _sessions_for

TOKENS = 60
RATE = 30.0
LEVELS = (50, 100)
RECONNECTS = 100
LEASE_S = 3.0  # make_wsgi_app's default lease_s


def _logs(folder: str) -> List[Tuple[str, str]]:
    logs = [("none", ""), ("memory", "memory:"), ("sqlite", f"sqlite:///{folder}/runs.sqlite")]
    for name, env in (("redis", "STREAMENGINE_TEST_REDIS_URL"), ("postgres", "STREAMENGINE_TEST_PG_DSN")):
        if os.environ.get(env):
            logs.append((name, os.environ[env]))
    redis = os.environ.get("STREAMENGINE_TEST_REDIS_URL")
    if redis:  # no wait to group (grouped only with appends already queued); the earlier 20 ms window
        logs += [("redis-0ms", redis + "#group_delay_s=0"), ("redis-w20", redis + "#append_window_s=0.02")]
    return logs


def _reconnects(port: int, count: int) -> Dict[str, Any]:
    """Time from a reconnect's request to its first ``id:`` frame: a run is started, left after 5 frames, resumed.

    It resumes after frame 3, so its first frame is in the log already: the
    figure is the reconnect's cost, not the wait for the model's next token.
    """
    times: List[float] = []
    for _ in range(count):
        run_id = _started_run(port)
        t0 = time.monotonic()
        _resumed(port, run_id, 3, until=(b"id: ",))
        times.append(time.monotonic() - t0)
    return {"n": len(times), "p50_ms": percentile(times, 50) * 1e3, "p99_ms": percentile(times, 99) * 1e3}


def _producer_lost(upstream: Server, url: str, repeats: int, marker: bytes) -> List[float]:
    """Seconds from ``kill -9`` of the worker producing a run to a reader's ``marker`` frame.

    gunicorn with one gthread worker; the run streams for 20 s, so it is
    still going when its worker dies; the reader reconnects (gunicorn starts
    a new worker) with the Last-Event-ID it had until ``marker``: the
    ``producer_lost`` error (``take_over=False``) or the ``reset`` a
    takeover announces (the default with a shared log).
    """
    app = ServedApp("gunicorn", "engine", upstream.base_url, f"paced:600:{RATE}:served:1", 16, runs_url=url)
    times: List[float] = []
    try:
        for _ in range(repeats):
            with _starting_run(app.port) as run_id:  # killed while its client is there: not a disconnect first
                (worker,) = child_pids(app.proc.pid)
                os.kill(worker, signal.SIGKILL)
                t0 = time.monotonic()
            while marker not in _resumed(app.port, run_id, 3, until=(marker, b"data: [DONE]")):
                if time.monotonic() - t0 > 30:
                    raise RuntimeError(f"runs bench: no {marker!r} within 30 s of kill -9 ({url.split(':')[0]})")
                time.sleep(0.05)
            times.append(time.monotonic() - t0)
    finally:
        app.close()
    return times


def _started_run(port: int) -> str:
    """A run started and read up to its fifth frame; its id (its client then leaves)."""
    with _starting_run(port) as run_id:
        return run_id


@contextlib.contextmanager
def _starting_run(port: int) -> Iterator[str]:
    """A run started and read up to its fifth frame; its id, while its client is still there."""
    body = b'{"messages": [{"role": "user", "content": "go"}]}'
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        data = b""
        while b".5\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
        yield data.split(b"X-Run-Id: ", 1)[1].split(b"\r\n", 1)[0].decode()


def _resumed(port: int, run_id: str, after: int, until: Tuple[bytes, ...] = (b"data: [DONE]",)) -> bytes:
    """What a reconnect after frame ``after`` reads until one of ``until`` or the end (b"" if nobody answered)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         f"Accept: text/event-stream\r\nLast-Event-ID: {run_id}.{after}\r\nConnection: close\r\n\r\n"
                         .encode())
            seen = b""
            while not any(marker in seen for marker in until):
                piece = sock.recv(65536)
                if not piece:
                    break
                seen += piece
            return seen
    except OSError:  # the new worker is not listening yet
        return b""


def run(upstream: Server, quick: bool = False, levels: tuple = LEVELS, tokens: int = TOKENS) -> Dict[str, Any]:
    model = f"paced:{tokens}:{RATE}:served:1"
    threads = max(levels) + 40
    out: Dict[str, Any] = {"tokens": tokens, "rate": RATE, "levels": list(levels), "rows": {}, "reconnect": {}}
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as folder:
        logs = _logs(folder)
        out["logs"] = [name for name, _ in logs]
        apps: Dict[str, ServedApp] = {}
        try:
            for name, url in logs:
                apps[name] = ServedApp("waitress", "engine", upstream.base_url, model, threads, runs_url=url)
            idle = {}
            for name, app in apps.items():
                LoadRun(app, 2, 0.0, (0.0, 0.0)).go(upstream.proc.pid)
                time.sleep(0.3)
                idle[name] = app.status()
            rows: Dict[str, Dict[str, Any]] = {name: {} for name in apps}
            for c in levels:
                for name, app in apps.items():
                    sessions = _sessions_for(c, quick, tokens)
                    rows[name][str(c)] = _level(app, upstream, c, sessions, idle[name], tokens)
            out["rows"] = rows
            for name, app in apps.items():
                if name != "none":
                    out["reconnect"][name] = _reconnects(app.port, 20 if quick else RECONNECTS)
        finally:
            for app in apps.values():
                app.close()
        shared = [(name, url) for name, url in logs if name in ("sqlite", "redis", "postgres")]
        out["producer_lost"] = {name: _producer_lost(upstream, url + "#take_over=0", 1 if quick else 3,
                                                     b"producer_lost") for name, url in shared}
        out["taken_over"] = {name: _producer_lost(upstream, url, 1 if quick else 3, b"event: reset")
                             for name, url in shared}
    return out


def render(r: Dict[str, Any], verdict: Callable[[bool], str]) -> List[str]:
    lines = [f"16. served runs in a log: {r['tokens']} tokens at {r['rate']:g}/s per session, waitress; "
             "CPU per delivered token against runs=None"]
    rows = r["rows"]
    base = rows.get("none", {})
    lines.append(f"  {'log':<9} {'C':>4} {'CPU/token':>10} {'x none':>7} {'late p99':>9} {'TTFT p50':>9} "
                 f"{'complete':>9}")
    for name, levels in rows.items():
        for c, row in levels.items():
            ratio = row["cpu_per_token_us"] / base[c]["cpu_per_token_us"] if c in base else float("nan")
            late = row.get("lateness_p99_ms")
            ttft = row.get("ttft_p50_ms")
            lines.append(f"  {name:<9} {c:>4} {row['cpu_per_token_us']:>8.0f}us {ratio:>6.2f}x "
                         f"{late if late is not None else float('nan'):>7.1f}ms "
                         f"{ttft if ttft is not None else float('nan'):>7.1f}ms {row['complete']:>5}/{row['sessions']}")
    redis = rows.get("redis", {})
    ratios = [redis[c]["cpu_per_token_us"] / base[c]["cpu_per_token_us"] for c in ("50", "100")
              if c in redis and c in base]
    if ratios:
        lines.append(f"  target <= 1.3x with Redis at C = 50/100: {max(ratios):.2f}x, {verdict(max(ratios) <= 1.3)}")
    for name, rec in r.get("reconnect", {}).items():
        lines.append(f"  reconnect -> first frame, {name}: p50 {rec['p50_ms']:.1f} ms, p99 {rec['p99_ms']:.1f} ms "
                     f"({rec['n']} reconnects; target p99 < 250 ms: {verdict(rec['p99_ms'] < 250)})")
    for name, times in r.get("taken_over", {}).items():
        lines.append(f"  kill -9 -> reset (taken over), {name}: " + ", ".join(f"{t:.2f} s" for t in times))
    for name, times in r.get("producer_lost", {}).items():
        lines.append(f"  kill -9 -> producer_lost (take_over=False), {name}: " + ", ".join(f"{t:.2f} s" for t in times)
                     + f" (target <= lease 3 s + 1 s: {verdict(max(times) <= LEASE_S + 1)})")
    missing = {"memory", "sqlite", "redis", "postgres"} - set(r.get("logs", []))
    if missing:
        lines.append(f"  not measured (no server; run under scripts/test's services): {', '.join(sorted(missing))}")
    return lines
