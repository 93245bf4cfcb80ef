"""Soak: many runs through the WSGI app under waitress, with random faults injected.

Run it with ``scripts/soak`` (defaults: 1000 sequential runs, then 100 at
once).  Each run is a real HTTP POST to ``/v1/chat/stream`` on a waitress
server; the engine behind it talks to a FakeProvider whose every answer is
drawn at random from a fault list: drops before and during the stream,
503s, 429s, stalls and keep-alive-only streams (small idle timeout),
in-band errors, invalid frames, tools that fail, tools that hang past a
small deadline (some ignoring their cancel flag), and clients that hang up
mid-stream.

What must hold afterwards:

* every run that was read to the end ended with an ``event: done`` frame
  followed by ``data: [DONE]``, and none reported an internal error;
* with the server still up, the thread count comes back to where it was
  after a warm-up of the same shape (pools are allowed to be warm; growth
  is a leak), as does traced memory (within a small margin);
* once everything is shut down, no thread the soak started is left.

Exit status 0 when all of that holds; the report says what did not.
The test suite runs a short version (``tests/faults/test_soak.py``).
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import random
import sys
import threading
import time
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import requests
import waitress
from waitress import wasyncore

from streamengine._clients.http.connection import CancellableAdapter
from streamengine._clients.openai import OpenAICompatibleClient
from streamengine._engine.run import EngineConfig, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool
from streamengine.wsgi import make_wsgi_app

STREAM_PATH = "/v1/chat/stream"

# fault name -> weight.  Most answers are fine: a soak is load with faults, not faults only.
FAULTS: Dict[str, int] = {
    "ok": 30,
    "ok_slow": 6,
    "tool": 12,
    "two_tools": 4,
    "tool_error": 5,
    "tool_hung": 4,
    "tool_stubborn": 3,
    "http_503": 6,
    "http_429": 4,
    "drop_before_headers": 4,
    "drop_mid_stream": 4,
    "stall": 3,
    "keep_alive_only": 2,
    "in_band_error": 4,
    "invalid_json": 3,
    "truncated": 3,
}
ABORT_RATE = 0.04  # share of runs whose client hangs up after the first token


# --- the scripted provider --------------------------------------------------------------------------


class FaultyProvider:
    """Draws one fault per chat request, thread-safely, from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.injected: collections.Counter = collections.Counter()
        names = list(FAULTS)
        self.names = names
        self.weights = [FAULTS[n] for n in names]

    def pick(self) -> Tuple[str, int]:
        with self.lock:
            fault = self.rng.choices(self.names, self.weights)[0]
            token = self.rng.randrange(1_000_000)
            self.injected[fault] += 1
        return fault, token

    def respond(self, payload: Dict[str, Any]) -> List[Any]:
        fault, token = self.pick()
        return steps_for(fault, token)


def _block(name: str, args: Dict[str, Any]) -> str:
    return f'<tool name="{name}">{json.dumps(args)}</tool>'


def steps_for(fault: str, token: int) -> List[Any]:
    words = f"Answer {token}: all is well here."
    if fault == "ok":
        return s.reply(words, pieces=4)
    if fault == "ok_slow":
        return [s.text("Thinking "), s.delay(0.05), s.comment(), s.text("done "), s.text(str(token))]
    if fault == "tool":
        return [s.text("Let me check. "), s.text(_block("lookup", {"q": str(token)})), s.text(" One moment.")]
    if fault == "two_tools":
        return [s.text(_block("lookup", {"q": f"a{token}"}) + _block("lookup", {"q": f"b{token}"}))]
    if fault == "tool_error":
        return [s.text("Trying. " + _block("broken", {"q": str(token)}))]
    if fault == "tool_hung":
        return [s.text("Waiting. " + _block("hang_cooperative", {"q": str(token)}))]
    if fault == "tool_stubborn":
        return [s.text("Waiting. " + _block("hang_stubborn", {"q": str(token)}))]
    if fault == "http_503":
        return [s.http_error(503, {"error": {"message": "overloaded", "type": "server_error"}})]
    if fault == "http_429":
        return [s.http_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0"})]
    if fault == "drop_before_headers":
        return [s.drop()]
    if fault == "drop_mid_stream":
        return [s.text("Partial "), s.text("answer "), s.drop()]
    if fault == "stall":
        return [s.stall()]
    if fault == "keep_alive_only":
        return [s.forever(s.comment())]
    if fault == "in_band_error":
        return [s.text("Half "), s.error_frame("Overloaded", type="overloaded_error")]
    if fault == "invalid_json":
        return [s.raw("data: {not json\n\n")]
    if fault == "truncated":
        return [s.text("Cut "), s.end()]
    raise ValueError(f"unknown fault {fault!r}")


def make_tools(stubborn_s: float) -> List[Any]:
    @tool
    def lookup(q: str) -> str:
        """Looks something up at once."""
        return f"found {q}"

    @tool
    def broken(q: str) -> str:
        """Always fails."""
        raise RuntimeError(f"backend down for {q}")

    @tool
    def hang_cooperative(q: str, ctx: ToolContext) -> str:
        """Hangs until its cancel flag (or deadline) says stop."""
        ctx.cancel_event.wait(10.0)
        return "stopped"

    @tool
    def hang_stubborn(q: str) -> str:
        """Ignores its flag for a while, then returns (its slot is stuck meanwhile)."""
        time.sleep(stubborn_s)
        return "too late"

    return [lookup, broken, hang_cooperative, hang_stubborn]


# --- the server --------------------------------------------------------------------------------------


@contextmanager
def serving(app: Callable[..., Any], threads: int, connection_limit: int) -> Iterator[str]:
    """waitress on a free port; every waitress thread is stopped on exit."""
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=threads,
                                    connection_limit=connection_limit, channel_request_lookahead=1,
                                    asyncore_use_poll=True)
    loop = threading.Thread(target=server.run, name="soak-waitress-loop", daemon=True)
    loop.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        loop.join(10)
        server.task_dispatcher.shutdown(timeout=10)


# --- one run from the client's side ------------------------------------------------------------------


@dataclass
class RunOutcome:
    ok: bool
    aborted: bool = False
    fallback_reason: Optional[str] = None
    problem: Optional[str] = None
    tokens: int = 0


def _frames(resp: requests.Response) -> Iterator[bytes]:
    """Complete SSE frames (without the blank line) as they arrive."""
    buffer = b""
    while True:
        data = resp.raw.read1(65536)
        if not data:
            if buffer.strip():
                yield buffer  # an unterminated tail: reported as a problem by the caller
            return
        buffer += data
        while b"\n\n" in buffer:
            frame, buffer = buffer.split(b"\n\n", 1)
            yield frame


def one_run(session: requests.Session, url: str, number: int, abort: bool, timeout: float) -> RunOutcome:
    body = {"messages": [{"role": "user", "content": f"soak run {number}"}]}
    try:
        with session.post(url + STREAM_PATH, json=body, stream=True, timeout=timeout) as resp:
            if resp.status_code != 200:
                return RunOutcome(False, problem=f"HTTP {resp.status_code}: {resp.text[:200]}")
            frames: List[bytes] = []
            tokens = 0
            for frame in _frames(resp):
                frames.append(frame)
                if frame.startswith(b"data: \""):
                    tokens += 1
                    if abort:
                        return RunOutcome(True, aborted=True, tokens=tokens)  # leaving the with closes it
            return _check(frames, tokens)
    except requests.RequestException as exc:
        return RunOutcome(False, problem=f"{type(exc).__name__}: {exc}")


def _check(frames: List[bytes], tokens: int) -> RunOutcome:
    if not frames or frames[-1] != b"data: [DONE]":
        return RunOutcome(False, problem=f"did not end with data: [DONE] (last frame {frames[-1:]!r})")
    if len(frames) < 2 or not frames[-2].startswith(b"event: done\n"):
        return RunOutcome(False, problem=f"no done event before [DONE] (frame {frames[-2:-1]!r})")
    done = json.loads(frames[-2].split(b"\ndata: ", 1)[1])
    telemetry = done.get("telemetry") or {}
    reason = telemetry.get("stop_reason", telemetry.get("fallback_reason"))
    for frame in frames:
        if frame.startswith(b"event: error\n") and b"internal error" in frame:
            return RunOutcome(False, fallback_reason=reason, problem=f"internal error: {frame[:300]!r}")
    if reason == "internal_error":
        return RunOutcome(False, fallback_reason=reason, problem="fallback_reason internal_error")
    return RunOutcome(True, fallback_reason=reason, tokens=tokens)


# --- the soak ----------------------------------------------------------------------------------------


@dataclass
class Report:
    sequential: int = 0
    concurrent: int = 0
    seed: int = 0
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    problems: List[str] = field(default_factory=list)
    injected: Dict[str, int] = field(default_factory=dict)
    threads_before_start: int = 0
    threads_warm: int = 0
    threads_after: int = 0
    threads_after_shutdown: int = 0
    leftover_threads: List[str] = field(default_factory=list)
    engine_threads_after: List[str] = field(default_factory=list)
    new_threads: List[str] = field(default_factory=list)
    memory_warm: int = 0
    memory_after: int = 0
    memory_margin: int = 0
    active_streams_after: Optional[int] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures()

    def failures(self) -> List[str]:
        out = list(self.problems[:20])
        if self.threads_after > self.threads_warm:
            out.append(f"threads did not come back: {self.threads_after} with the server up, "
                       f"{self.threads_warm} after the warm-up (new since then: {self.new_threads})")
        if self.engine_threads_after:
            out.append(f"engine threads still alive at rest: {self.engine_threads_after}")
        if self.leftover_threads:
            out.append(f"threads left after shutdown: {self.leftover_threads}")
        if self.memory_after - self.memory_warm > self.memory_margin:
            out.append(f"traced memory grew by {(self.memory_after - self.memory_warm) / 1e6:.2f} MB "
                       f"(margin {self.memory_margin / 1e6:.2f} MB)")
        if self.active_streams_after:
            out.append(f"{self.active_streams_after} WSGI streams still active")
        return out

    def summary(self) -> str:
        lines = [
            f"soak: {self.sequential} sequential + {self.concurrent} concurrent runs, seed {self.seed}, "
            f"{self.seconds:.1f}s",
            f"  outcomes: {dict(sorted(self.outcomes.items()))}",
            f"  faults injected: {dict(sorted(self.injected.items()))}",
            f"  threads: {self.threads_before_start} before start, {self.threads_warm} warm, "
            f"{self.threads_after} after the runs, {self.threads_after_shutdown} after shutdown",
            f"  traced memory: {self.memory_warm / 1e6:.2f} MB warm, {self.memory_after / 1e6:.2f} MB after",
        ]
        failures = self.failures()
        lines.append("  result: OK" if not failures else "  result: FAILED\n    " + "\n    ".join(failures))
        return "\n".join(lines)


def _engine_threads() -> List[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("streamengine-") and t.is_alive()]


def _at_rest(session: requests.Session, target: Optional[int], timeout: float) -> int:
    """Close pooled provider connections, then wait (bounded) until the engine's threads are gone
    and the thread count is down to ``target``; return the count reached.

    Closing the pool first makes the two measurements comparable: each pooled
    keep-alive connection holds a FakeProvider handler thread.
    """
    for adapter in session.adapters.values():
        adapter.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _engine_threads() and (target is None or threading.active_count() <= target):
            break
        time.sleep(0.05)
    return threading.active_count()


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _batch(url: str, count: int, start: int, parallel: int, abort_rng: random.Random,
           report: Report, timeout: float) -> None:
    """``count`` runs, ``parallel`` at a time, each worker with its own session."""
    numbers = list(range(start, start + count))
    aborts = {n for n in numbers if abort_rng.random() < ABORT_RATE}
    lock = threading.Lock()
    todo = collections.deque(numbers)

    def worker() -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    if not todo:
                        return
                    number = todo.popleft()
                outcome = one_run(session, url, number, number in aborts, timeout)
                with lock:
                    key = "aborted" if outcome.aborted else (outcome.fallback_reason or "answered")
                    report.outcomes[key] += 1
                    if not outcome.ok:
                        report.outcomes["FAILED"] += 1
                        report.problems.append(f"run {number}: {outcome.problem}")

    threads = [threading.Thread(target=worker, name=f"soak-client-{i}", daemon=True)
               for i in range(max(1, min(parallel, count)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_soak(sequential: int = 1000, concurrent: int = 100, seed: int = 1, *, idle_timeout: float = 0.25,
             tool_timeout: float = 0.25, warmup: Optional[int] = None, memory_margin: int = 3_000_000,
             run_timeout: float = 30.0, verbose: bool = False) -> Report:
    """Run the soak in this process; returns a :class:`Report` (``report.ok``)."""
    report = Report(sequential=sequential, concurrent=concurrent, seed=seed, memory_margin=memory_margin)
    report.threads_before_start = threading.active_count()
    before = set(threading.enumerate())
    started = time.monotonic()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    faults = FaultyProvider(seed)
    abort_rng = random.Random(seed + 1)
    width = max(1, concurrent)
    fp = FakeProvider(max_recorded=50)
    fp.respond_with(faults.respond)
    session = requests.Session()
    # More pooled connections than streams at once (the client's own adapter keeps 64):
    # no "pool is full" discards.  The client keeps a cancellable adapter it finds mounted.
    session.mount(fp.base_url + "/", CancellableAdapter(pool_maxsize=width + 16))
    client = OpenAICompatibleClient(fp.base_url, api_key="sk-soak", session=session)
    config = EngineConfig(models=["primary", "fallback"], idle_timeout=idle_timeout, completion_timeout=5.0,
                          tool_timeout=tool_timeout, max_retries=1, max_continuations=1, pool_size=width + 8)
    engine = StreamingEngine(client, make_tools(stubborn_s=tool_timeout * 2), config)
    engine.executor.idle_exit_s = 0.5  # idle tool threads leave quickly, so "back to warm" is quick to see
    # All soak clients share one address: the per-client cap must admit every concurrent run.
    app = make_wsgi_app(engine, heartbeat_s=0.2, max_streams=width, max_streams_per_client=width)
    try:
        with serving(app, threads=width + 8, connection_limit=2 * width + 50) as url:
            # Warm-up of the same shape as the soak: pools and caches are allowed to fill once.
            warm = warmup if warmup is not None else min(20, max(1, sequential // 10))
            _batch(url, warm, 0, 1, random.Random(seed + 2), Report(), run_timeout)
            if concurrent:
                _batch(url, width, warm, width, random.Random(seed + 3), Report(), run_timeout)
            report.threads_warm = _at_rest(session, None, 10.0)
            warm_threads = set(threading.enumerate())
            report.memory_warm = _traced()
            base = warm + width
            _batch(url, sequential, base, 1, abort_rng, report, run_timeout)
            if verbose:
                print(f"  sequential done: {dict(report.outcomes)}", file=sys.stderr)
            if concurrent:
                _batch(url, concurrent, base + sequential, concurrent, abort_rng, report, run_timeout)
            report.threads_after = _at_rest(session, report.threads_warm, 10.0)
            report.new_threads = sorted(t.name for t in threading.enumerate()
                                        if t not in warm_threads and t.is_alive())
            if report.new_threads and verbose:
                import traceback
                frames = sys._current_frames()
                for t in threading.enumerate():
                    if t not in warm_threads and t.ident in frames:
                        print(f"--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident])[-8:]),
                              file=sys.stderr)
            report.engine_threads_after = _engine_threads()
            report.memory_after = _traced()
            report.active_streams_after = getattr(app, "active_streams", None)
    finally:
        engine.close()
        client.close()
        session.close()
        fp.close()
        if not tracing:
            tracemalloc.stop()
    report.injected = dict(faults.injected)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not left:
            break
        time.sleep(0.05)
    report.leftover_threads = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    report.threads_after_shutdown = threading.active_count()
    report.seconds = time.monotonic() - started
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=1000, help="runs one after another (default 1000)")
    parser.add_argument("--concurrent", type=int, default=100, help="runs at the same time (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault generator (default 1)")
    parser.add_argument("--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if args.sequential < 0 or args.concurrent < 0:
        parser.error("--sequential and --concurrent must be >= 0")
    report = run_soak(args.sequential, args.concurrent, args.seed, verbose=args.verbose)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
