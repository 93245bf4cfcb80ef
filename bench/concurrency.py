"""5. Concurrency: 200 SSE sessions at once against one served engine (waitress, one process).

The app (bench/app.py: ``make_wsgi_app`` under waitress, threads = sessions + 40)
streams from the pre-rendered server.  Each session's first round is 100
tokens over ~1 s with one tool call (50 ms) at token 30; the continuation
round is 20 tokens.  All sessions start at the same instant (a barrier).

Checked per session: the whole text arrived (both rounds), one ``tool_start``,
one ``tool_result`` (ok), one ``done``, and ``[DONE]`` last.  Measured: time to
first token (request sent -> first token frame read), p50/p99, against one
session alone; the app process's threads and RSS, sampled every 20 ms, as
peak minus idle, per session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from .common import (
    ROOT,
    Server,
    chunked_lines,
    content_frame,
    finish_frames,
    median,
    percentile,
    pid_status,
    post_raw,
    process_cpu_s,
    seg,
)

FIRST = [f" w{i}" for i in range(100)]
FIRST[30] = '<tool name="lookup">{"query": "x"}</tool>'
SECOND = [f" r{i}" for i in range(20)]
GAP_S = 0.01


def _scripts(server: Server) -> str:
    segments = [seg(content_frame(FIRST[0]))]
    segments += [seg(content_frame(t), delay=GAP_S) for t in FIRST[1:]]
    segments.append(seg(finish_frames()))
    followup = [seg("".join(content_frame(t) for t in SECOND) + finish_frames())]
    return server.script("concurrency", segments, followup)


class App:
    def __init__(self, upstream: str, model: str, threads: int) -> None:
        # Run as a script (not -m): streamengine is then found the way the bench
        # process found it (the installed package, or PYTHONPATH when set).
        # BENCH_APP_SCRIPT swaps in a wrapper, e.g. one that runs the app under a profiler.
        app = os.environ.get("BENCH_APP_SCRIPT") or os.path.join(ROOT, "bench", "app.py")
        self.proc = subprocess.Popen([sys.executable, app, upstream, model, str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"bench app did not start: {line!r}")
        self.port = int(line.split()[1])

    def status(self) -> Dict[str, int]:
        return pid_status(self.proc.pid)

    def cpu_s(self) -> float:
        """User + system CPU seconds the app process has used."""
        return process_cpu_s(self.proc.pid)

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


def _session(port: int, start: Optional[threading.Barrier], out: Dict[str, Any]) -> None:
    if start is not None:
        start.wait()
    t0 = time.monotonic()
    sock = post_raw(port, "/v1/chat/stream", {"messages": [{"role": "user", "content": "go"}]})
    first = None
    text: List[str] = []
    counts = {"tool_start": 0, "tool_result": 0, "done": 0, "error": 0, "[DONE]": 0, "ok_results": 0}
    event = None
    last = None
    try:
        for lines in chunked_lines(sock):
            for line in lines:
                if line.startswith(b"event: "):
                    event = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = line[6:]
                    if data == b"[DONE]":
                        counts["[DONE]"] += 1
                        last = "[DONE]"
                    elif event is None:
                        if first is None:
                            first = time.monotonic()
                        text.append(json.loads(data))
                        last = "token"
                    else:
                        counts[event] = counts.get(event, 0) + 1
                        if event == "tool_result" and json.loads(data).get("ok"):
                            counts["ok_results"] += 1
                        last = event
                elif not line.strip():
                    event = None
    except OSError as exc:
        out["error"] = repr(exc)
    finally:
        sock.close()
    out.update(t0=t0, first=first, end=time.monotonic(), text="".join(text), counts=counts, last=last)


def _complete(result: Dict[str, Any]) -> bool:
    c = result.get("counts", {})
    return (result.get("text") == "".join(FIRST) + "".join(SECOND) and c.get("tool_start") == 1
            and c.get("ok_results") == 1 and c.get("done") == 1 and c.get("[DONE]") == 1
            and c.get("error") == 0 and result.get("last") == "[DONE]")


def run(server: Server, sessions: int = 200, baseline_runs: int = 3) -> Dict[str, Any]:
    model = _scripts(server)
    app = App(server.base_url, model, threads=sessions + 40)
    try:
        alone, alone_total = [], []
        for _ in range(baseline_runs + 1):  # the first one warms the app up
            result: Dict[str, Any] = {}
            _session(app.port, None, result)
            if not _complete(result):
                raise RuntimeError(f"concurrency: a lone session was incomplete: {result}")
            alone.append(result["first"] - result["t0"])
            alone_total.append(result["end"] - result["t0"])
        alone, alone_total = alone[1:], alone_total[1:]
        time.sleep(0.2)
        idle = app.status()
        samples: List[Dict[str, int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(dict(app.status(), t=time.monotonic()))
                stop.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        results = [{} for _ in range(sessions)]
        barrier = threading.Barrier(sessions + 1)
        threads = [threading.Thread(target=_session, args=(app.port, barrier, results[i]), daemon=True)
                   for i in range(sessions)]
        for t in threads:
            t.start()
        sampler.start()
        cpu0 = app.cpu_s()
        barrier.wait()
        started = time.monotonic()
        for t in threads:
            t.join(60)
        wall = time.monotonic() - started
        cpu = app.cpu_s() - cpu0
        stop.set()
        sampler.join()
        complete = sum(1 for r in results if _complete(r))
        ttft = [r["first"] - r["t0"] for r in results if r.get("first") is not None]
        peak_threads = max(s["threads"] for s in samples)
        peak_rss = max(s["rss"] for s in samples)
        # Per open session: at the sample with the most sessions open at once.
        for point in samples:
            point["open"] = sum(1 for r in results if r.get("t0", 1e18) <= point["t"] <= r.get("end", 0))
        busiest = max(samples, key=lambda point: (point["open"], point["threads"]))
        open_max = max(1, busiest["open"])
        tokens = len(FIRST) + len(SECOND)
        return {
            "sessions": sessions, "complete": complete, "wall_s": wall,
            "threads_configured": sessions + 40, "tokens_round1": len(FIRST), "tokens_round2": len(SECOND),
            "token_gap_ms": GAP_S * 1e3, "session_alone_s": median(alone_total),
            "cpu_s": cpu, "cpu_per_session_s": cpu / sessions, "cpu_per_token_us": cpu / (sessions * tokens) * 1e6,
            "cpu_busy": cpu / wall,
            "ttft_alone_s": median(alone),
            "ttft_p50_s": percentile(ttft, 50) if ttft else None,
            "ttft_p99_s": percentile(ttft, 99) if ttft else None,
            "threads_idle": idle["threads"], "threads_peak": peak_threads, "open_max": busiest["open"],
            "threads_per_session": (busiest["threads"] - idle["threads"]) / open_max,
            "rss_idle": idle["rss"], "rss_peak": peak_rss,
            "rss_per_session": (busiest["rss"] - idle["rss"]) / open_max,
            "incomplete_examples": [{k: r.get(k) for k in ("counts", "last", "error")}
                                    for r in results if not _complete(r)][:3],
        }
    finally:
        app.close()
