"""9. Many runs, one engine: N paced runs at once share one ``StreamingEngine`` and its tool pool.

Each run streams ``TOKENS`` tokens at ``GAP_S`` apart from bench/server.py (its
own process) with ``CALLS`` inline tool blocks spread through the answer; each
tool sleeps 100-300 ms (a worker held, no CPU), as a slow API call does.
Every run has its own consumer thread iterating ``engine.run``.

Two figures per call:

* *queue wait*: ``ToolResult.queue_wait_s`` from the run's ``DoneEvent``
  (submitted -> a worker took it);
* *delivery*: the tool's last statement records ``time.monotonic()`` (keyed
  by its arguments: run and call index); the consumer records the time it
  received that call's ``ToolResultEvent``.  The difference is how long a
  finished result waits before the caller sees it: the pool's hand-back, the
  wake-up pipe and the consumer thread that drives the run.

Also checked: every ``tool_start`` has exactly one ``tool_result`` and every
call has a result.  The burst repeats until there are ``min_calls`` calls.

The fairness variant runs the same burst on a small pool (``pool_size=4``):
the calls queue, and what matters is that no run waits much longer than
another (max / min of the per-run median queue wait).

The timeout variant calls a tool that outlives its ``timeout`` (it waits for
its cancel flag) on a pool smaller than the burst, so some calls wait in the
queue first: *late* is how long after its deadline (start + timeout) the
timeout result was fixed (``ToolResult.ended_at``), and *told* how long
after it the caller received that ``tool_result``.
"""
from __future__ import annotations

import functools
import json
import threading
import time
from typing import Any, Dict, List, Tuple

from .common import Server, content_frame, finish_frames, median, percentile, run_together, seg

TOKENS = 100
GAP_S = 0.010
CALLS = 3
WORDS = [" The", " plan", " needs", " three", " facts", ",", " so", " I", " look", " them", " up", "."]


def _duration_ms(run: int, i: int) -> int:
    return 100 + (run * CALLS + i) * 37 % 201  # 100-300 ms, different for each call


#: The timeout variant's tool: its own timeout, and how long it would run without one.
OVERRUN_TIMEOUT_S = 0.1


def _script(run: int, tool: str = "nap") -> List[Dict[str, Any]]:
    """``TOKENS`` paced tokens; a tool block replaces the token at 20%, 50% and 80% of the answer."""
    at = {TOKENS * (2 + 3 * i) // 10: i for i in range(CALLS)}
    segments = []
    for k in range(TOKENS):
        if k in at:
            i = at[k]
            args = json.dumps({"run": run, "i": i, "ms": _duration_ms(run, i)})
            text = f'<tool name="{tool}">{args}</tool>'
        else:
            text = WORDS[k % len(WORDS)]
        segments.append(seg(content_frame(text), delay=GAP_S))
    segments.append(seg(finish_frames()))
    return segments


class Burst:
    """One burst: ``runs`` runs started together on one engine, each consumed by its own thread."""

    def __init__(self, engine: Any, prompts: List[str], returned: Dict[Tuple[int, int], float]) -> None:
        self.engine, self.prompts, self.returned = engine, prompts, returned
        self.delivery: List[float] = []
        self.queue_wait: Dict[int, List[float]] = {r: [] for r in range(len(prompts))}
        self.problems: List[str] = []
        self.calls = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        run_together([functools.partial(self._consume, r) for r in range(len(self.prompts))], "multirun")

    def _consume(self, run: int) -> None:
        from streamengine import DoneEvent, ToolResultEvent, ToolStartEvent
        keys: Dict[str, Tuple[int, int]] = {}
        starts: Dict[str, int] = {}
        results: Dict[str, int] = {}
        received: Dict[str, float] = {}
        done = None
        for event in self.engine.run([{"role": "user", "content": self.prompts[run]}]):
            if isinstance(event, ToolResultEvent):
                received[event.result.call_id] = time.monotonic()
                results[event.result.call_id] = results.get(event.result.call_id, 0) + 1
            elif isinstance(event, ToolStartEvent):
                args = json.loads(event.call.arguments)
                keys[event.call.id] = (args["run"], args["i"])
                starts[event.call.id] = starts.get(event.call.id, 0) + 1
            elif isinstance(event, DoneEvent):
                done = event.result
        self._check(run, done, keys, starts, results, received)

    def _check(self, run: int, done: Any, keys: Dict[str, Tuple[int, int]], starts: Dict[str, int],
               results: Dict[str, int], received: Dict[str, float]) -> None:
        problems = []
        if done is None or done.error is not None:
            problems.append(f"run {run} ended with {getattr(done, 'error', 'no DoneEvent')}")
        tool_results = list(done.tool_results) if done is not None else []
        if len(tool_results) != CALLS or not all(r.ok for r in tool_results):
            problems.append(f"run {run}: {len(tool_results)} tool results, want {CALLS} ok: "
                            + "; ".join(f"{r.name} {r.error}" for r in tool_results if not r.ok))
        for call_id, n in starts.items():
            if results.get(call_id) != 1:
                problems.append(f"run {run}: call {call_id} had {n} tool_start and {results.get(call_id, 0)} "
                                f"tool_result events, want 1 each")
        delivery = []
        for call_id, key in keys.items():
            if key in self.returned and call_id in received:
                delivery.append(received[call_id] - self.returned[key])
            else:
                problems.append(f"run {run}: call {key} started but its return or result was not seen")
        with self.lock:
            self.problems += problems
            self.delivery += delivery
            self.queue_wait[run] += [r.queue_wait_s for r in tool_results]
            self.calls += len(tool_results)


def _variant(server: Server, runs: int, pool_size: int, min_calls: int) -> Dict[str, Any]:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    returned: Dict[Tuple[int, int], float] = {}

    @tool(name="nap")
    def nap(run: int, i: int, ms: int) -> str:
        """Waits on a slow service (sleeps ``ms``), holding a worker but no CPU."""
        time.sleep(ms / 1000.0)
        returned[(run, i)] = time.monotonic()
        return "ok"

    prompts = [server.script(f"multirun-{r}", _script(r)) for r in range(runs)]
    config = EngineConfig(models=["bench-multirun"], tool_mode="inline", pool_size=pool_size,
                          max_tools_per_round=CALLS, max_tools_total=CALLS, max_continuations=1)
    delivery: List[float] = []
    per_run: Dict[int, List[float]] = {r: [] for r in range(runs)}
    problems: List[str] = []
    calls = bursts = 0
    t0 = time.monotonic()
    with StreamingEngine(OpenAICompatibleClient(server.base_url), [nap], config) as engine:
        while calls < min_calls:
            returned.clear()
            burst = Burst(engine, prompts, returned)
            burst.run()
            bursts += 1
            calls += burst.calls
            delivery += burst.delivery
            problems += burst.problems
            for r, waits in burst.queue_wait.items():
                per_run[r] += waits
    waits = [w for ws in per_run.values() for w in ws]
    run_p50 = [median(ws) for ws in per_run.values() if ws]
    return {
        "runs": runs, "pool_size": pool_size, "bursts": bursts, "calls": calls, "wall_s": time.monotonic() - t0,
        "queue_wait_ms": _pcts(waits), "delivery_ms": _pcts(delivery),
        "run_queue_p50_ms": {"min": min(run_p50) * 1e3, "max": max(run_p50) * 1e3,
                             "by_run": [round(w * 1e3, 1) for w in run_p50]} if run_p50 else None,
        "problems": problems[:10], "problem_count": len(problems),
    }


def _timeouts(server: Server, runs: int, pool_size: int, min_calls: int) -> Dict[str, Any]:
    """Tools that outlive their timeout, some queued first: how late each timeout fires and is told."""
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, ToolContext, ToolResultEvent, tool

    @tool(name="overrun", timeout=OVERRUN_TIMEOUT_S)
    def overrun(ctx: ToolContext, run: int, i: int, ms: int) -> str:
        """Runs past its timeout unless told to stop."""
        ctx.cancel_event.wait(2.0)
        return "too late"

    prompts = [server.script(f"timeouts-{r}", _script(r, "overrun")) for r in range(runs)]
    config = EngineConfig(models=["bench-timeouts"], tool_mode="inline", pool_size=pool_size,
                          max_tools_per_round=CALLS, max_tools_total=CALLS, max_continuations=1)
    late: List[float] = []
    told: List[float] = []
    queued = 0
    lock = threading.Lock()

    def consume(engine: Any, prompt: str) -> None:
        nonlocal queued
        mine_late, mine_told, mine_queued = [], [], 0
        for event in engine.run([{"role": "user", "content": prompt}]):
            if isinstance(event, ToolResultEvent) and event.result.timed_out and event.result.started_at:
                due = event.result.started_at + OVERRUN_TIMEOUT_S
                mine_late.append(event.result.ended_at - due)
                mine_told.append(time.monotonic() - due)
                mine_queued += event.result.queue_wait_s > 0.001
        with lock:
            late.extend(mine_late)
            told.extend(mine_told)
            queued += mine_queued

    with StreamingEngine(OpenAICompatibleClient(server.base_url), [overrun], config) as engine:
        while len(late) < min_calls:
            before = len(late)
            run_together([functools.partial(consume, engine, p) for p in prompts], "timeouts")
            if len(late) == before:
                break  # nothing timed out: report what there is rather than loop
    return {"runs": runs, "pool_size": pool_size, "timeout_ms": OVERRUN_TIMEOUT_S * 1e3, "queued": queued,
            "late_ms": _pcts(late), "told_ms": _pcts(told)}


def _pcts(values: List[float]) -> Dict[str, float]:
    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {"n": len(values), "p50": percentile(values, 50) * 1e3, "p99": percentile(values, 99) * 1e3,
            "max": max(values) * 1e3}


def run(server: Server, runs: int = 20, min_calls: int = 1000, fair_calls: int = 120) -> Dict[str, Any]:
    return {"tokens": TOKENS, "gap_ms": GAP_S * 1e3, "calls_per_run": CALLS,
            "shared": _variant(server, runs, 32, min_calls),
            "small_pool": _variant(server, runs, 4, fair_calls),
            "timeouts": _timeouts(server, runs, 16, min_calls)}
