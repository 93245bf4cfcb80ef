"""``python -m bench``: run the benchmarks, print the table, write bench/results.json.

``scripts/bench`` sets up ``.venv-bench`` and runs this.  Options:

  --only 1,3     run some sections (1 throughput, 2 latency, 3 overlap, 4 scaling, 5 concurrency burst,
                 6 paced, 7 served steady state, 8 slow consumer, 9 many runs on one engine,
                 10 where a CPU-bound tool runs, 11 import cost, 12 MCP tools, 13 OpenTelemetry cost,
                 14 instructions per served token, counted by callgrind, 15 a token in the frontends' framers,
                 16 served runs in a log)
  --quick        smaller inputs and fewer repeats: a smoke test, not figures to quote
  --out PATH     where to write the JSON (default bench/results.json)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from typing import Any, Dict, List

from . import (
    common,
    concurrency,
    executor,
    frontends,
    imports,
    instructions,
    latency,
    mcp_calls,
    multirun,
    otel,
    overlap,
    paced,
    report,
    runs,
    scaling,
    served,
    slowconsumer,
    throughput,
)

SECTIONS = {"1": "throughput", "2": "latency", "3": "overlap", "4": "scaling", "5": "concurrency",
            "6": "paced", "7": "served", "8": "slowconsumer", "9": "multirun", "10": "executor",
            "11": "imports", "12": "mcp", "13": "otel",
            "14": "instructions", "15": "frontends", "16": "runs"}
NEEDS_UPSTREAM = {"paced", "served", "slowconsumer", "instructions", "runs"}


def _environment() -> Dict[str, Any]:
    import streamengine
    versions = {}
    for name in ("requests", "urllib3", "sseclient", "openai", "waitress", "gunicorn", "httpx", "httpx_sse"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "?")
        except ImportError:
            versions[name] = None
    try:
        with open("/proc/loadavg") as f:
            load = float(f.read().split()[0])
    except (OSError, ValueError):
        load = None
    return {
        "load_1min_at_start": load,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(), "streamengine": getattr(streamengine, "__version__", "?"),
        "streamengine_path": os.path.dirname(streamengine.__file__), "libraries": versions,
    }


def _freeze_harness_heap() -> None:
    """Import what the readers need, then move every object alive now out of the GC's sight.

    The openai SDK (pydantic, httpx...) leaves a few hundred thousand objects
    behind; each full collection then scans them all (~50 ms, measured here),
    a pause that lands on whatever is being timed.  Frozen objects
    (``gc.freeze``) are never scanned again: collections cost what the code
    under test allocated, not what this harness imported.
    """
    import gc

    import requests  # noqa: F401
    import sseclient  # noqa: F401

    try:
        import openai  # noqa: F401
    except ImportError:
        pass
    gc.collect()
    gc.freeze()


def _our_cpu_s(*servers: Any) -> float:
    """CPU seconds of this process, its finished children (workers, apps) and the upstream servers."""
    t = os.times()
    return (time.process_time() + t.children_user + t.children_system
            + sum(common.process_cpu_s(s.proc.pid) for s in servers if s is not None))


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated section numbers (default: all)")
    parser.add_argument("--quick", action="store_true", help="small inputs, few repeats (smoke test)")
    parser.add_argument("--out", default=os.path.join(common.ROOT, "bench", "results.json"))
    args = parser.parse_args(argv)
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from 1-{len(SECTIONS)}")
    common.quiet_logs()
    _freeze_harness_heap()
    q = args.quick
    results: Dict[str, Any] = {"environment": _environment(), "quick": q, "seconds": {}}
    failed = False
    started = time.monotonic()
    names = {SECTIONS[n] for n in wanted}
    upstream = common.Server("bench.upstream") if names & NEEDS_UPSTREAM else None
    try:
        with common.Server() as server:
            plan = {
                "throughput": lambda: throughput.run(server, n=20_000 if q else 100_000, repeats=2 if q else 3,
                                                     sdk_repeats=1 if q else 3, processes=1 if q else 3),
                "latency": lambda: latency.run(server, streams=3 if q else 50, calls=10 if q else 20),
                "overlap": lambda: overlap.run(server, repeats=1 if q else 3, first_only=q),
                "scaling": lambda: scaling.run(server, quick=q),
                "concurrency": lambda: concurrency.run(server, sessions=40 if q else 200),
                "paced": lambda: paced.run(upstream.port, tokens=100 if q else 1500, repeats=1 if q else 3),
                "served": lambda: (served.run(upstream, quick=True, levels=(20,), servers=("waitress",), tokens=30)
                                   if q else served.run(upstream)),
                "slowconsumer": lambda: slowconsumer.run(upstream, tokens=30_000 if q else 200_000),
                "multirun": lambda: multirun.run(server, min_calls=120 if q else 1000, fair_calls=60 if q else 120),
                "executor": lambda: executor.run(server, tokens=100 if q else 150, repeats=1 if q else 3),
                "imports": lambda: imports.run(repeats=5 if q else 30),
                "mcp": lambda: mcp_calls.run(quick=q),
                "instructions": lambda: instructions.run(upstream.port, sizes=(60,) if q else instructions.SIZES),
                "runs": lambda: (runs.run(upstream, quick=True, levels=(20,), tokens=30) if q else runs.run(upstream)),
                "otel": lambda: otel.run(repeats=1 if q else 5, tokens=300 if q else 5000, streams=2 if q else 10),
                "frontends": lambda: frontends.run(repeats=2 if q else 7, lengths=(2_000,) if q else frontends.LENGTHS),
            }
            for number in sorted(wanted, key=int):
                name = SECTIONS[number]
                print(f"[bench] {number}. {name} ...", file=sys.stderr, flush=True)
                t0, machine0, ours0 = time.monotonic(), common.machine_cpu_s(), _our_cpu_s(server, upstream)
                try:
                    results[name] = plan[name]()
                except Exception as exc:  # one broken section must not hide the others
                    failed = True
                    results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                    traceback.print_exc()
                wall = time.monotonic() - t0
                results["seconds"][name] = round(wall, 1)
                # the app processes of sections 5 and 7 have ended and been waited for: in children's time
                results.setdefault("other_load", {})[name] = round(common.other_cores(
                    machine0, ours0, common.machine_cpu_s(), _our_cpu_s(server, upstream), wall), 2)
    finally:
        if upstream is not None:
            upstream.close()
    results["seconds"]["total"] = round(time.monotonic() - started, 1)
    text = report.render(results)
    print(text)
    results["table"] = text
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"[bench] wrote {args.out} ({results['seconds']['total']:.0f} s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
