"""3. Overlap: tools that run while the answer still streams, against running them afterwards.

The eager-tools workload: an answer streamed over 3-4 s (a token every 20 ms)
that calls k tools (k = 3, 6, 9) of 0.5-2 s each, at points spread through
the answer.  Three ways to serve it, all with the same tools and the same
stream:

* ``engine``      StreamingEngine: each tool starts when its ``</tool>`` arrives;
* ``after``       read the whole stream, then run all tools in parallel;
* ``sequential``  read the whole stream, then run the tools one by one.

Measured: **ready** = from sending the request until the stream has ended *and*
every tool result is available to the caller (for the engine: the later of
the last ``tool_result`` event of round 1 reaching the consumer of ``run()``
and the server's write of the stream's end, since the engine hands each
result over the moment it exists, often before the stream ends; the
continuation round that follows is not counted).
Ideal = ``max(stream end, max_i(</tool>_i written + duration_i))``, from the
server's own timestamps: no client can do better.
"""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Tuple

from .common import Server, content_frame, finish_frames, median, seg

MESSAGES = [{"role": "user", "content": "overlap"}]
TOKEN_GAP_S = 0.02
WORDS = [" lorem", " ipsum", " dolor", " sit", " amet", ",", " consectetur", " adipiscing", " elit", "."]
APPROACHES = ("engine", "after", "sequential")


#: (label, tools, where the calls fall: the fraction of the answer they are spread over, seed)
WORKLOADS = (("3 tools, anywhere", 3, 1.0, 1003), ("6 tools, anywhere", 6, 1.0, 1006),
             ("9 tools, anywhere", 9, 1.0, 1009), ("6 tools, first half", 6, 0.5, 2006))


def workload(label: str, k: int, spread: float, seed: int) -> Dict[str, Any]:
    """A seeded workload: stream length, and per tool its close time and duration.

    ``spread`` 1.0 puts the calls anywhere in the answer (a late long tool then
    bounds what any client can gain); 0.5 in its first half, as when a model
    names what it will look up before it writes.
    """
    rnd = random.Random(seed)
    length = rnd.uniform(3.0, 4.0)
    tokens = int(length / TOKEN_GAP_S)
    slots = sorted(rnd.sample(range(5, int((tokens - 10) * spread)), k))
    tools = [(slot, round(rnd.uniform(0.5, 2.0), 3)) for slot in slots]
    return {"label": label, "k": k, "length_s": length, "tokens": tokens, "tools": tools}


def _script(w: Dict[str, Any], tag: str) -> List[Dict[str, Any]]:
    at = {slot: (i, d) for i, (slot, d) in enumerate(w["tools"])}
    segments = []
    for t in range(w["tokens"]):
        if t in at:
            i, d = at[t]
            block = content_frame(f'<tool name="work">{{"i": {i}, "ms": {int(d * 1000)}}}') \
                + content_frame("</tool>")
            segments.append(seg(block, delay=TOKEN_GAP_S, mark=f"{tag}:tool{i}"))
        else:
            segments.append(seg(content_frame(WORDS[t % len(WORDS)]), delay=TOKEN_GAP_S))
    segments.append(seg(finish_frames(), delay=TOKEN_GAP_S, mark=f"{tag}:end"))
    return segments


def _work(i: int, ms: int) -> str:
    time.sleep(ms / 1000.0)
    return f"tool {i} done"


def _run_engine(server: Server, model: str, k: int) -> Tuple[float, float]:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    from streamengine._engine.events import ToolResultEvent
    config = EngineConfig(models=[model], tool_mode="inline", max_tools_per_round=k, max_tools_total=k,
                          pool_size=k + 1, max_continuations=1)
    with StreamingEngine(OpenAICompatibleClient(server.base_url), [tool(name="work")(_work)], config) as engine:
        t0 = time.monotonic()
        results = 0
        ready = None
        for event in engine.run(MESSAGES):
            if isinstance(event, ToolResultEvent) and ready is None:
                if not event.result.ok:
                    raise RuntimeError(f"overlap: tool failed: {event.result.error}")
                results += 1
                if results == k:
                    ready = time.monotonic()
        if ready is None:
            raise RuntimeError(f"overlap: engine delivered {results} of {k} tool results")
    return t0, ready


def _run_after(server: Server, model: str, k: int, parallel: bool) -> Tuple[float, float]:
    """The usual way: stream the answer, find the calls, run them once the stream is over."""
    from streamengine import CompletionOptions, OpenAICompatibleClient
    from streamengine._inline import InlineToolScanner
    client = OpenAICompatibleClient(server.base_url)
    parser = InlineToolScanner()
    calls = []
    t0 = time.monotonic()
    for chunk in client.stream(MESSAGES, options=CompletionOptions(model=model)):
        if chunk.content:
            calls += parser.feed(chunk.content).calls
    calls += parser.flush().calls
    if len(calls) != k:
        raise RuntimeError(f"overlap: found {len(calls)} of {k} calls")
    if parallel:
        with ThreadPoolExecutor(max_workers=k) as pool:
            list(pool.map(lambda c: _work(**c.args()), calls))
    else:
        for call in calls:
            _work(**call.args())
    ready = time.monotonic()
    client.close()
    return t0, ready


def _one(server: Server, w: Dict[str, Any], approach: str, rep: int, out: Dict[tuple, Any]) -> None:
    tag = f"ov-{w['label']}-{approach}-{rep}".replace(" ", "_").replace(",", "")
    model = server.script(tag, _script(w, tag))
    try:
        if approach == "engine":
            t0, ready = _run_engine(server, model, w["k"])
        else:
            t0, ready = _run_after(server, model, w["k"], parallel=approach == "after")
        out[(w["label"], approach, rep)] = (tag, t0, ready)
    except BaseException as exc:  # reported by run()
        out[(w["label"], approach, rep)] = exc


def run(server: Server, repeats: int = 3, first_only: bool = False) -> Dict[str, Any]:
    """All sessions run at once: they mostly sleep, and this keeps the section to one
    sequential baseline's length (~15 s) instead of the sum of all (``first_only``: ~7 s)."""
    workloads = {spec[0]: workload(*spec) for spec in WORKLOADS[:1 if first_only else None]}
    ks = list(workloads)
    raw: Dict[tuple, Any] = {}
    threads = [threading.Thread(target=_one, args=(server, workloads[k], a, rep, raw))
               for rep in range(repeats) for k in ks for a in APPROACHES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    marks = dict(server.marks(clear=True))
    rows = {}
    for k in ks:
        w = workloads[k]
        row: Dict[str, Any] = {"tools": w["k"], "stream_s": w["length_s"],
                               "durations_s": [d for _, d in w["tools"]]}
        for approach in APPROACHES:
            ratios, seconds, ideals = [], [], []
            for rep in range(repeats):
                got = raw[(k, approach, rep)]
                if isinstance(got, BaseException):
                    raise RuntimeError(f"overlap k={k} {approach}: {got}") from got
                tag, t0, ready = got
                if approach == "engine":  # its tool results stream out as they finish, maybe before the end
                    ready = max(ready, marks[f"{tag}:end"])
                ideal = max([marks[f"{tag}:end"]] + [marks[f"{tag}:tool{i}"] + d
                                                     for i, (_, d) in enumerate(w["tools"])]) - t0
                seconds.append(ready - t0)
                ideals.append(ideal)
                ratios.append((ready - t0) / ideal)
            row[approach] = {"ready_s": median(seconds), "ideal_s": median(ideals),
                             "vs_ideal": median(ratios)}
        possible = []
        for rep in range(repeats):
            tag, t0, _ = raw[(k, "after", rep)]
            ideal = max([marks[f"{tag}:end"]] + [marks[f"{tag}:tool{i}"] + d
                                                 for i, (_, d) in enumerate(w["tools"])])
            possible.append((marks[f"{tag}:end"] + max(d for _, d in w["tools"]) - t0) / (ideal - t0))
        possible = median(possible)
        row["possible_speedup_vs_after"] = possible
        row["engine_speedup_vs_after"] = row["after"]["ready_s"] / row["engine"]["ready_s"]
        row["engine_speedup_vs_sequential"] = row["sequential"]["ready_s"] / row["engine"]["ready_s"]
        rows[k] = row
    return {"definition": "ready = request sent -> stream ended and all tool results available "
                          "(round 1; the continuation round is not counted); ideal = max(stream end, "
                          "max_i(</tool>_i written + duration_i)) from server timestamps",
            "workloads": rows}
