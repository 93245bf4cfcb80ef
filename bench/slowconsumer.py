"""8. Slow consumer: what the engine holds when the code reading its events is slower than the model.

``StreamingEngine.complete`` drains events at C speed, so a queue between the
producer and the caller never fills there.  A real consumer (a WSGI server
writing to a slow client, a UI rendering each token) is slower.  Here the
upstream writes a burst as fast as its socket takes it, and the caller of
``StreamingEngine.run`` spends ``WORK_US`` of CPU on every token event.

Sampled every 100 ms, in a fresh process: its RSS, the token events consumed,
and the frames the upstream has handed to the kernel (``/_progress``).
*In flight* = written - consumed: frames in kernel socket buffers plus
whatever the engine has queued.  The floor is what the kernel alone holds:
a reader that stops reading entirely (measured first).  With backpressure
in-flight and RSS stay flat near that floor; without it they grow with the
stream.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, List

from .common import ROOT, post_raw

WORK_US = 30.0
MESSAGES = [{"role": "user", "content": "slow"}]


def _progress(port: int, tag: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_progress") as resp:
        return int(json.loads(resp.read()).get(tag, 0))


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _kernel_floor(port: int, tokens: int) -> int:
    """Frames the upstream can write to a reader that never reads: the kernel's socket buffers."""
    tag = "slow-floor"
    sock = post_raw(port, "/v1/chat/completions", {"model": f"paced:{tokens}:0:{tag}:0", "messages": MESSAGES,
                                                    "stream": True})
    try:
        last, stable = -1, 0
        while stable < 3:  # three samples 100 ms apart without progress: the buffers are full
            time.sleep(0.1)
            now = _progress(port, tag)
            stable = stable + 1 if now == last else 0
            last = now
        return last
    finally:
        sock.close()


def bench_tool(query: str) -> str:
    """A registered tool, so the inline parser is on (it is never called here)."""
    return query


CONSUMERS = [
    ("fast", "StreamingEngine.complete (drains in C)"),
    ("cpu", "run(), {work:.0f} us of CPU per token (holds the GIL)"),
    ("sleep", "run(), sleeps {work:.0f} us per token (like a blocked socket write)"),
]
SERVED = ("served", "served (waitress): client reads 4 KiB every 10 ms")


def _consume(port: int, tokens: int, mode: str, work_us: float) -> Dict[str, Any]:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, TokenEvent, tool
    tag = f"slow-{mode}"
    model = f"paced:{tokens}:0:{tag}:0"
    engine = StreamingEngine(OpenAICompatibleClient(f"http://127.0.0.1:{port}/v1"), [tool(bench_tool)],
                             EngineConfig(models=[model], tool_mode="inline", completion_timeout=600.0))
    consumed = [0]
    samples: List[Dict[str, float]] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            written = _progress(port, tag)
            samples.append({"t": time.monotonic() - t0, "rss": _rss(), "consumed": consumed[0],
                            "written": written, "in_flight": written - consumed[0]})
            stop.wait(0.1)

    rss0 = _rss()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        if mode == "fast":
            consumed[0] = len(engine.complete(MESSAGES).answer) // 2  # each token is " w"
        else:
            clock, sleep, wait_s = time.perf_counter, time.sleep, work_us * 1e-6
            for event in engine.run(MESSAGES):
                if isinstance(event, TokenEvent):
                    consumed[0] += 1
                    if mode == "sleep":
                        sleep(wait_s)
                        continue
                    end = clock() + wait_s
                    while clock() < end:  # CPU work, as rendering a token would be
                        pass
    finally:
        stop.set()
        sampler.join()
        engine.close()
    if consumed[0] != tokens:
        raise RuntimeError(f"slow consumer: got {consumed[0]} of {tokens} tokens")
    seconds = time.monotonic() - t0
    return {"work_us": work_us, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "rss_start": rss0,
            "rss_peak": max(s["rss"] for s in samples), "in_flight_peak": max(s["in_flight"] for s in samples),
            "samples": samples[:: max(1, len(samples) // 40)]}


def _worker() -> None:
    from .common import quiet_logs
    spec = json.loads(sys.argv[1])
    quiet_logs()
    import streamengine  # noqa: F401 - imported before the RSS baseline
    out = {"floor": _kernel_floor(spec["port"], spec["tokens"])}
    for mode, _ in CONSUMERS:
        out[mode] = _consume(spec["port"], spec["tokens"], mode, spec["work_us"])
    print(json.dumps(out))


def served_slow(upstream: Any, tokens: int, read_bytes: int = 4096, every_s: float = 0.01) -> Dict[str, Any]:
    """The engine's WSGI app under waitress, and a browser on a slow link: ``read_bytes`` every ``every_s``."""
    from .served import ServedApp
    tag = "slow-served"
    app = ServedApp("waitress", "engine", upstream.base_url, f"paced:{tokens}:0:{tag}:0", threads=8)
    try:
        time.sleep(0.2)
        rss0 = app.status()["rss"]
        sock = post_raw(app.port, "/v1/chat/stream", {"messages": MESSAGES})
        consumed, carry, samples = 0, b"", []
        t0 = next_sample = time.monotonic()
        try:
            while True:
                data = sock.recv(read_bytes)
                if not data:
                    break
                seen = carry + data
                consumed += seen.count(b'data: "')  # one per token frame
                carry = seen[-6:]
                now = time.monotonic()
                if now >= next_sample:
                    written = _progress(upstream.port, tag)
                    samples.append({"t": now - t0, "rss": app.status()["rss"], "consumed": consumed,
                                    "written": written, "in_flight": written - consumed})
                    next_sample += 0.1
                time.sleep(every_s)
        finally:
            sock.close()
        if consumed != tokens:
            raise RuntimeError(f"served slow consumer: read {consumed} of {tokens} tokens")
        seconds = time.monotonic() - t0
        return {"work_us": every_s * 1e6, "read_bytes": read_bytes, "tokens": tokens, "seconds": seconds,
                "tokens_per_s": tokens / seconds, "rss_start": rss0,
                "rss_peak": max(s["rss"] for s in samples), "in_flight_peak": max(s["in_flight"] for s in samples),
                "samples": samples[:: max(1, len(samples) // 40)]}
    finally:
        app.close()


def run(upstream: Any, tokens: int = 200_000, work_us: float = WORK_US) -> Dict[str, Any]:
    code = f"import sys; sys.path.append({ROOT!r}); from bench.slowconsumer import _worker; _worker()"
    spec = {"port": upstream.port, "tokens": tokens, "work_us": work_us}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], cwd=os.path.join(ROOT, "bench"),
                         capture_output=True, text=True, check=False, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"slow consumer worker failed: {out.stderr.strip()[-1500:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["served"] = served_slow(upstream, tokens)
    return result
