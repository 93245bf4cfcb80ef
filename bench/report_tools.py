"""The table's lines for the tool sections: many runs on one engine (9), where a CPU-bound tool runs (10)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

Verdict = Callable[[bool], str]


def multirun(t: Dict[str, Any], verdict: Verdict) -> List[str]:
    s, f = t["shared"], t["small_pool"]
    out = [f"9. Many runs, one engine - {s['runs']} runs at once, each {t['tokens']} tokens at {t['gap_ms']:.0f} ms "
           f"with {t['calls_per_run']} inline tools sleeping 100-300 ms; queue wait = ToolResult.queue_wait_s, "
           f"delivery = tool returned -> caller got its tool_result",
           f"   {'engine':<34}{'calls':>7}{'queue p50':>11}{'p99 ms':>8}{'delivery p50':>14}{'p99':>7}{'max ms':>8}"]
    for label, v in ((f"pool_size={s['pool_size']} ({s['bursts']} burst(s))", s),
                     (f"pool_size={f['pool_size']} ({f['bursts']} burst(s))", f)):
        q, d = v["queue_wait_ms"], v["delivery_ms"]
        out.append(f"   {label:<34}{v['calls']:>7}{q['p50']:>11.2f}{q['p99']:>8.2f}{d['p50']:>14.2f}{d['p99']:>7.2f}"
                   f"{d['max']:>8.2f}")
    d = s["delivery_ms"]
    enough = d["n"] >= 1000
    out.append("   target delivery p99 < 5 ms: "
               + (f"{verdict(d['p99'] < 5.0)} ({d['p99']:.2f} ms over {d['n']} calls)" if enough
                  else f"too few samples for a p99 ({d['n']} calls)"))
    problems = s["problem_count"] + f["problem_count"]
    out.append("   every tool_start has exactly one tool_result, every call a result: "
               + ("MET" if problems == 0 else f"MISSED ({problems} problems: "
                  + "; ".join((s["problems"] + f["problems"])[:3]) + ")"))
    timeouts = t.get("timeouts")
    if timeouts:
        late, told = timeouts["late_ms"], timeouts["told_ms"]
        out.append(f"   tools past their {timeouts['timeout_ms']:.0f} ms timeout, pool_size={timeouts['pool_size']} "
                   f"({timeouts['queued']} of {late['n']} calls queued first): fixed after the deadline p50 "
                   f"{late['p50']:.2f} p99 {late['p99']:.2f} max {late['max']:.2f} ms; told p50 {told['p50']:.2f} "
                   f"p99 {told['p99']:.2f} ms")
        out.append("   target timeout fires within 20 ms of its deadline (p99): "
                   + (f"{verdict(late['p99'] < 20.0)} ({late['p99']:.2f} ms over {late['n']} calls)"
                      if late["n"] >= 1000 else f"too few samples for a p99 ({late['n']} calls)"))
    spread = f["run_queue_p50_ms"]
    if spread:
        lo, hi = spread["min"], spread["max"]
        ratio = f"{hi / lo:.2f}x" if lo > 0 else "inf (a run never waited)"
        out.append(f"   fair sharing on pool_size={f['pool_size']}: per-run median queue wait {lo:.0f}-{hi:.0f} ms, "
                   f"max/min {ratio} (1.00x: every run waits alike)")
        if spread.get("by_run"):
            out.append("     per-run median queue wait, runs in the order they were started (ms): "
                       + " ".join(f"{w:.0f}" for w in spread["by_run"]))
    return out


def executor(t: Dict[str, Any], verdict: Verdict) -> List[str]:
    rows = t["placements"]
    out = [f"10. Where a CPU-bound tool runs - {t['streams']} streams of {t['tokens']} tokens at {t['gap_ms']:.0f} ms, "
           f"each calling a ~{t['tool_s_here'] * 1e3:.0f} ms pure-Python tool (executor='remote'); "
           f"gap = between tokens the caller receives",
           f"   {'tool runs on':<34}{'gaps':>7}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'p99 x base':>12}"]
    from .executor import PLACEMENTS
    for key, label in PLACEMENTS:
        row = rows.get(key)
        if row is None:
            continue
        if "error" in row:
            out.append(f"   {label:<34}not available: {row['error']}")
            continue
        out.append(f"   {label:<34}{row['n']:>7}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}{row['max_ms']:>8.2f}"
                   f"{row['p99_vs_baseline']:>12.2f}")
    if t.get("problem_count"):
        out.append(f"   runs that failed: {t['problem_count']} ({'; '.join(t['problems'][:3])})")
    remote = [rows[k] for k in ("process_pool", "dask") if k in rows and "error" not in rows[k]]
    if "threads" in rows and remote:
        best = min(r["p99_ms"] for r in remote)
        out.append(f"   off the engine's process, the streams' gap p99 is {rows['threads']['p99_ms'] / best:.1f}x "
                   f"smaller than on its threads: {verdict(best < rows['threads']['p99_ms'])} "
                   f"(on 2 cores two busy workers still take CPU from the streams' process)")
    return out
