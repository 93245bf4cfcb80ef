"""10. Where a CPU-bound tool runs: the engine's threads, a process pool, a Dask cluster.

``K`` streams of ``tokens`` (150) tokens at 100 tokens/s (bench/server.py, its own
process) run at once on one ``StreamingEngine``; each stream calls
``bench.cpu_tool.spin`` once (~200 ms of pure-Python arithmetic, declared
``executor="remote"``), the calls spread over the streams' first half.  The
figure is what a user of *another* stream feels: the gap between consecutive
tokens the caller receives (round 1 only), p99 and max over all streams.

Placements, measured in interleaved rounds with the same streams:

* *no tool* (the baseline): the tool block's place holds a plain word;
* *engine threads*: no executor (a remote-declared tool then runs on the
  engine's pool, in this process, holding its GIL);
* *process pool*: ``ProcessPoolExecutor(2, mp_context=spawn)`` passed as
  ``StreamingEngine(..., executor=...)``;
* *Dask*: ``LocalCluster(n_workers=2, processes=True, threads_per_worker=1)``,
  ``client.get_executor()``.

Each executor is started and warmed (every worker imports the tool) before
the clock runs.  On 2 cores two busy workers still take CPU from the
streams' process: the OS, not the GIL, shares it then.
"""
from __future__ import annotations

import functools
import json
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .common import Server, content_frame, finish_frames, median, percentile, run_together, seg

TOKENS = 150
GAP_S = 0.010
TOOL_S = 0.2
PLACEMENTS = [("baseline", "no tool (baseline)"), ("threads", "engine threads (no executor)"),
              ("process_pool", "ProcessPoolExecutor(2, spawn)"), ("dask", "Dask LocalCluster(2 processes)")]


def _script(stream: int, streams: int, tokens: int, n: Optional[int]) -> List[Dict[str, Any]]:
    """Paced tokens; the tool block rides on one token (same frames and pace with or without it)."""
    at = tokens // 8 + stream * (tokens // 2) // max(1, streams)
    segments = []
    for k in range(tokens):
        text = " w"
        if k == at and n is not None:
            text += f'<tool name="spin">{json.dumps({"n": n})}</tool>'
        segments.append(seg(content_frame(text), delay=GAP_S))
    segments.append(seg(finish_frames()))
    return segments


def _gaps(engine: Any, prompt: str, out: List[float], problems: List[str], lock: threading.Lock) -> None:
    from streamengine import DoneEvent, RoundEvent, TokenEvent
    seen: List[float] = []
    round_no = 1
    done = None
    for event in engine.run([{"role": "user", "content": prompt}]):
        if isinstance(event, TokenEvent):
            if round_no == 1:
                seen.append(time.monotonic())
        elif isinstance(event, RoundEvent):
            round_no = event.round
        elif isinstance(event, DoneEvent):
            done = event.result
    with lock:
        if done is None or done.error is not None:
            problems.append(f"{prompt}: {getattr(done, 'error', 'no DoneEvent')}")
        elif any(not r.ok for r in done.tool_results):
            problems.append(f"{prompt}: " + "; ".join(str(r.error) for r in done.tool_results if not r.ok))
        out += [b - a for a, b in zip(seen, seen[1:])]


def _measure(engine: Any, prompts: List[str], problems: List[str]) -> List[float]:
    gaps: List[float] = []
    lock = threading.Lock()
    run_together([functools.partial(_gaps, engine, p, gaps, problems, lock) for p in prompts], "executor")
    return gaps


def _process_pool() -> Any:
    import concurrent.futures
    import multiprocessing

    from . import cpu_tool
    pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(cpu_tool.warm, [0.5, 0.5]))
    return pool, pool.shutdown


def _dask() -> Any:
    import logging
    for name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from distributed import Client, LocalCluster

    from . import cpu_tool
    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                           dashboard_address=None)
    client = Client(cluster)
    client.run(cpu_tool.warm, 0.0)

    def close() -> None:
        client.close()
        cluster.close()
    return client.get_executor(), close


def run(server: Server, streams: int = 8, tokens: int = TOKENS, repeats: int = 3) -> Dict[str, Any]:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine

    from . import cpu_tool
    n = cpu_tool.iterations_for(TOOL_S)
    prompts = {kind: [server.script(f"executor-{kind}-{s}", _script(s, streams, tokens, arg)) for s in range(streams)]
               for kind, arg in (("tool", n), ("baseline", None))}
    config = EngineConfig(models=["bench-executor"], tool_mode="inline", max_continuations=1, pool_size=16)
    executors: Dict[str, Any] = {"baseline": None, "threads": None}
    closers: List[Callable[[], None]] = []
    result: Dict[str, Any] = {"streams": streams, "tokens": tokens, "gap_ms": GAP_S * 1e3, "tool_iterations": n,
                              "tool_s_here": TOOL_S, "placements": {}}
    try:
        for key, start in (("process_pool", _process_pool), ("dask", _dask)):
            try:
                executors[key], close = start()
                closers.append(close)
            except Exception as exc:  # e.g. distributed not installed: a row that says why
                result["placements"][key] = {"error": f"{type(exc).__name__}: {exc}"}
        gaps: Dict[str, List[float]] = {k: [] for k in executors}
        problems: List[str] = []
        for _ in range(repeats):
            for key, executor in executors.items():
                engine = StreamingEngine(OpenAICompatibleClient(server.base_url), [cpu_tool.spin], config,
                                         executor=executor)
                with engine:
                    gaps[key] += _measure(engine, prompts["baseline" if key == "baseline" else "tool"], problems)
    finally:
        for close in closers:
            close()
    base_p99 = percentile(gaps["baseline"], 99)
    for key, values in gaps.items():
        p99 = percentile(values, 99)
        result["placements"][key] = {"n": len(values), "p50_ms": median(values) * 1e3, "p99_ms": p99 * 1e3,
                                     "max_ms": max(values) * 1e3, "p99_vs_baseline": p99 / base_p99}
    result["problems"] = problems[:10]
    result["problem_count"] = len(problems)
    return result
