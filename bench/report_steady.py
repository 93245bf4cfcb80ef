"""The tables of sections 6-8 (paced, served steady state, slow consumer): what users feel."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

Verdict = Callable[[bool], str]


def paced(t: Dict[str, Any], verdict: Verdict) -> List[str]:
    from .paced import PEERS, READERS
    rows = t["readers"]
    med = {k: r["cpu_us_spread"]["median"] for k, r in rows.items() if "cpu_us_spread" in r}
    raw = med.get("raw")
    reads = rows.get("raw", {}).get("reads_per_token")
    out = [f"6. Paced - {t['tokens']:,} tokens at {t['rate']:.0f} tokens/s, one frame per read"
           + (f" (the raw reader made {reads:.2f} reads per token)" if reads else "")
           + f"; CPU per token = the reader process's CPU (all threads) / tokens; {t['repeats']} streams per "
             f"reader, each reader in a fresh process",
           f"   {'reader':<46}{'us/token':>10}{'min':>8}{'max':>8}{'x raw':>8}"]
    for key, label in READERS:
        row = rows.get(key, {})
        if key not in med:
            why = row.get("unavailable") or (row.get("error") or "no result").splitlines()[-1][:120]
            out.append(f"   {label:<46}  not available: {why}")
            continue
        sp = row["cpu_us_spread"]
        ratio = f"{med[key] / raw:>8.2f}" if raw else f"{'-':>8}"
        out.append(f"   {label:<46}{sp['median']:>10.0f}{sp['min']:>8.0f}{sp['max']:>8.0f}{ratio}")
    if "engine" in med and raw:
        e = med["engine"]
        peers = {k: v for k, v in med.items() if k in PEERS}
        cheaper = [f"{dict(READERS)[k]} {v:.0f} us" for k, v in peers.items() if v <= e]
        missing = [k for k in PEERS if k not in peers]
        below = (verdict(not cheaper) + (f" ({'; '.join(cheaper)} <= engine {e:.0f} us)" if cheaper else "")
                 + (f" (not measured: {', '.join(missing)})" if missing else ""))
        out.append(f"   targets: engine <= 1.5x the raw reader: {verdict(e <= 1.5 * raw)} ({e / raw:.2f}x); "
                   f"engine below every peer: {below}")
    return out


def _share(value: Any) -> str:
    return f"{value * 100:.0f}%" if value is not None else "-"


def _ms(value: Any) -> str:
    return f"{value:.1f}" if value is not None else "-"


def served(t: Dict[str, Any], verdict: Verdict) -> List[str]:
    from .common import BUSY_CORES
    from .served import MIN_P99_SAMPLES
    out = [f"7. Served, steady state - sessions arrive one every {t['tokens'] / t['rate']:.0f} s / C, so C are open "
           f"at once; each {t['tokens']} tokens at {t['rate']:.0f} tokens/s, one frame per read; figures from the "
           f"steady window only (after the ramp, before the drain); relay = requests -> WSGI generator, no engine",
           f"   {'server / app':<18}{'C':>5}{'open':>6}{'done':>10}{'CPU us/tok':>11}{'x relay':>8}{'cores':>7}"
           f"{'sys':>5}{'gc':>5}{'TTFT p50':>9}{'p99 ms (n)':>15}{'late p99':>9}"
           f"{'thr/sess':>9}{'KB/sess':>8}{'other':>7}"]
    ratios: Dict[str, List[float]] = {}
    busy = 0.0
    for name, row in t["rows"].items():
        server, kind = name.split("/")
        relay = t["rows"].get(f"{server}/relay", {}).get("levels", {})
        for c, lv in row["levels"].items():
            x = lv["cpu_per_token_us"] / relay[c]["cpu_per_token_us"] if kind != "relay" and c in relay else None
            if x is not None:
                ratios.setdefault(server, []).append(x)
            busy = max(busy, lv["other_cores"])
            p99 = _ms(lv["ttft_p99_ms"]) + ("*" if lv["ttft_n"] < MIN_P99_SAMPLES else "") + f" ({lv['ttft_n']})"
            done = f"{lv['complete']}/{lv['sessions']}"
            vs_relay = f"{x:.2f}" if x else "-"
            out.append(f"   {server + ' ' + kind:<18}{c:>5}{lv['open_mean']:>6.0f}{done:>10}"
                       f"{lv['cpu_per_token_us']:>11.0f}{vs_relay:>8}{lv['cpu_cores']:>7.2f}"
                       f"{_share(lv.get('sys_share')):>5}{_share(lv.get('gc_share')):>5}"
                       f"{_ms(lv['ttft_p50_ms']):>9}{p99:>15}{_ms(lv['lateness_p99_ms']):>9}"
                       f"{lv['threads_per_session']:>9.2f}{lv['rss_per_session'] / 1e3:>8.0f}{lv['other_cores']:>7.2f}")
    out.append(f"   * fewer than {MIN_P99_SAMPLES:,} sessions: that p99 is near the maximum, not a 1-in-100 figure. "
               "open = sessions open on average (above C: the server fell behind and sessions piled up); "
               "late = token read by the client - written by the upstream; sys = the kernel's share of the app's CPU; "
               "gc = the garbage collector's share (gc.callbacks in the app); "
               "other = cores other processes used")
    lag = max((lv.get("upstream_lag_p99_ms") or 0) for row in t["rows"].values() for lv in row["levels"].values())
    if lag > 5:
        out.append(f"   the upstream itself ran up to {lag:.1f} ms late (p99): "
                   "the machine, not only the app, was short of CPU")
    if busy > BUSY_CORES:
        verdict = lambda ok: f"NOT COMPARABLE (machine busy: other processes used up to {busy:.2f} cores)"  # noqa: E731
    targets = [f"{server} engine CPU/token <= 1.2x relay: {verdict(max(xs) <= 1.2)} (worst {max(xs):.2f}x)"
               for server, xs in ratios.items()]
    threads = [(lv["threads_per_session"], f"{name.split('/')[0]} C={c}") for name, row in t["rows"].items()
               if name.endswith("/engine") for c, lv in row["levels"].items()]
    if threads:
        worst, where = max(threads)
        targets.append(f"engine threads per open session <= 1.05: {verdict(worst <= 1.05)} "
                       f"(worst {worst:.2f}, {where})")
    targets += [_ttft_target(t["rows"], server, verdict) for server in ratios]
    out.append("   targets: " + "; ".join(targets))
    return out


def _ttft_target(rows: Dict[str, Any], server: str, verdict: Verdict) -> str:
    """Issue 20: at C = 200, TTFT p99 < 100 ms wherever the relay holds it (one process, this machine)."""
    from .served import MIN_P99_SAMPLES
    engine = rows.get(f"{server}/engine", {}).get("levels", {}).get("200")
    relay = rows.get(f"{server}/relay", {}).get("levels", {}).get("200")
    if not engine or not relay:
        return f"{server} C=200 TTFT p99 < 100 ms: not measured"
    head = f"{server} C=200 TTFT p99 < 100 ms where the relay holds it: "
    if min(engine["ttft_n"], relay["ttft_n"]) < MIN_P99_SAMPLES:
        return head + "too few samples"
    figures = f" (engine {engine['ttft_p99_ms']:.0f} ms, relay {relay['ttft_p99_ms']:.0f} ms)"
    if relay["ttft_p99_ms"] >= 100:
        return head + "the relay does not hold it here either" + figures
    return head + verdict(engine["ttft_p99_ms"] < 100 and engine["complete"] == engine["sessions"]) + figures


def slow_consumer(t: Dict[str, Any], verdict: Verdict) -> List[str]:
    from .slowconsumer import CONSUMERS, SERVED
    floor = t["floor"]
    first = t[CONSUMERS[0][0]]
    out = [f"8. Slow consumer - a {first['tokens']:,}-token burst through StreamingEngine; in flight = frames the "
           f"upstream wrote - token events consumed; the kernel's socket buffers alone hold {floor:,}",
           f"   {'consumer':<58}{'tokens/s':>9}{'in flight':>11}{'RSS start':>11}{'peak':>9}{'growth':>9}"]
    grew = []
    for key, label in CONSUMERS + ([SERVED] if SERVED[0] in t else []):
        r = t[key]
        growth = r["rss_peak"] - r["rss_start"]
        out.append(f"   {label.format(work=r['work_us']):<58}{r['tokens_per_s']:>9,.0f}{r['in_flight_peak']:>11,}"
                   f"{r['rss_start'] / 1e6:>8.1f} MB{r['rss_peak'] / 1e6:>6.1f} MB{growth / 1e6:>6.1f} MB")
        # the served path has two sockets and waitress's buffers between the upstream and the reader:
        # the one-socket floor does not apply to its in-flight count, its RSS growth does
        if key == SERVED[0] and growth > 5e6:
            grew.append(f"{key}: the app process +{growth / 1e6:.1f} MB")
        elif key not in ("fast", SERVED[0]) and (r["in_flight_peak"] > 2 * floor or growth > 5e6):
            grew.append(f"{key}: {r['in_flight_peak'] - floor:,} events queued beyond the kernel's, "
                        f"+{growth / 1e6:.1f} MB")
    for key in ("sleep", SERVED[0]):
        steps = t[key]["samples"][:: max(1, len(t[key]["samples"]) // 8)] if key in t else []
        if steps:
            out.append(f"   over time ({key}; in flight/RSS): " + ", ".join(
                f"{s['t']:.1f} s {s['in_flight'] / 1e3:.0f}k/{s['rss'] / 1e6:.0f} MB" for s in steps))
    out.append(f"   target flat (in flight <= 2x the kernel's, RSS +5 MB at most; served: RSS) for a slow consumer: "
               f"{verdict(not grew)}" + (f" - no backpressure yet: {'; '.join(grew)}" if grew else ""))
    return out
