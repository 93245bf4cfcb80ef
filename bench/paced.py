"""6. Paced: CPU per token when tokens arrive one per read, at a model's pace.

A burst (section 1) packs ~290 frames into each 64 KiB read, which hides what
a real stream costs: every token is its own read, its own wake-up of every
thread on the path.  Here the upstream (bench/upstream.py) writes one frame
per HTTP chunk, ``RATE`` tokens a second, and each reader's cost is its
process CPU time (all threads, user + system) per token, not wall time,
which the pace fixes anyway.

Each reader runs in a fresh process of its own (imports, connection pools,
background threads: nothing leaks from one reader into the next one's
figure), warms up on a short stream, then reads ``repeats`` streams.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

from .common import ROOT, answer_of, raw_read, spread

RATE = 500.0  # tokens per second: a fast model
MESSAGES = [{"role": "user", "content": "paced"}]

READERS = [
    ("raw", "raw socket + split + scan_once (the limit)"),
    ("raw_loads", "the same reader with json.loads"),
    ("client", "OpenAICompatibleClient.stream"),
    ("engine", "StreamingEngine.run (xml parser on)"),
    ("httpx_sse", "httpx + httpx-sse"),
    ("openai_sdk", "openai SDK stream=True"),
    ("litellm", "litellm.completion stream=True"),
]
PEERS = ("httpx_sse", "openai_sdk", "litellm")


# --- the readers: each returns a function model -> answer text ----------------------------

def _raw(base_url: str, port: int, decoder: str) -> Callable[[str], str]:
    def run(model: str) -> str:
        text, reads = raw_read(port, model, MESSAGES, decoder)
        run.reads += reads  # type: ignore[attr-defined]
        return text
    run.reads = 0  # type: ignore[attr-defined]
    return run


def _client(base_url: str, port: int) -> Callable[[str], str]:
    from streamengine import CompletionOptions, OpenAICompatibleClient
    client = OpenAICompatibleClient(base_url)
    return lambda model: "".join(c.content for c in client.stream(MESSAGES, options=CompletionOptions(model=model))
                                 if c.content)


def bench_tool(query: str) -> str:
    """A registered tool, so the inline parser is on (it is never called here)."""
    return query


def _engine(base_url: str, port: int) -> Callable[[str], str]:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, TokenEvent, tool
    engines: Dict[str, Any] = {}

    def run(model: str) -> str:
        engine = engines.get(model)
        if engine is None:
            engine = engines[model] = StreamingEngine(OpenAICompatibleClient(base_url), [tool(bench_tool)],
                                                      EngineConfig(models=[model], tool_mode="inline"))
        return "".join(e.text for e in engine.run(MESSAGES) if isinstance(e, TokenEvent))

    return run


def _httpx_sse(base_url: str, port: int) -> Callable[[str], str]:
    import httpx
    from httpx_sse import connect_sse
    client = httpx.Client(timeout=60.0)
    url = base_url + "/chat/completions"

    def run(model: str) -> str:
        with connect_sse(client, "POST", url, json={"model": model, "messages": MESSAGES, "stream": True}) as src:
            return answer_of(sse.data for sse in src.iter_sse())

    return run


def _openai_sdk(base_url: str, port: int) -> Callable[[str], str]:
    from openai import OpenAI
    client = OpenAI(base_url=base_url, api_key="bench", max_retries=0)

    def run(model: str) -> str:
        stream = client.chat.completions.create(model=model, messages=MESSAGES, stream=True)
        return "".join(c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content)

    return run


def _litellm(base_url: str, port: int) -> Callable[[str], str]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the internet at import
    import litellm
    litellm.telemetry = False
    litellm.suppress_debug_info = True

    def run(model: str) -> str:
        stream = litellm.completion(model="openai/" + model, api_base=base_url, api_key="bench",
                                    messages=MESSAGES, stream=True, max_retries=0)
        return "".join(c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content)

    return run


MAKERS: Dict[str, Callable[..., Callable[[str], str]]] = {
    "raw": lambda b, p: _raw(b, p, "scan_once"), "raw_loads": lambda b, p: _raw(b, p, "loads"),
    "client": _client, "engine": _engine, "httpx_sse": _httpx_sse, "openai_sdk": _openai_sdk,
    "litellm": _litellm,
}


# --- one reader in its own process -----------------------------------------------------------

def _worker() -> None:
    import gc

    from .common import quiet_logs
    spec = json.loads(sys.argv[1])
    quiet_logs()
    base_url = f"http://127.0.0.1:{spec['port']}/v1"
    key, n, rate = spec["reader"], spec["tokens"], spec["rate"]
    try:
        run = MAKERS[key](base_url, spec["port"])
    except Exception as exc:  # a peer that cannot be imported is a row, not a crash
        print(json.dumps({"unavailable": f"{type(exc).__name__}: {exc}"[:200]}))
        return
    warm = f"paced:{min(n, 100)}:{rate}:{key}-warm:0"
    model = f"paced:{n}:{rate}:{key}:0"
    for _ in range(2):
        run(warm)
    gc.collect()
    gc.freeze()  # collections scan what the reader allocates, not the imports
    expected = " w" * n
    if hasattr(run, "reads"):
        run.reads = 0  # type: ignore[attr-defined]
    cpu_us: List[float] = []
    wall: List[float] = []
    for _ in range(spec["repeats"]):
        c0, t0 = time.process_time(), time.monotonic()
        answer = run(model)
        c1, t1 = time.process_time(), time.monotonic()
        if answer != expected:
            raise RuntimeError(f"paced/{key}: got {len(answer)} chars, expected {len(expected)}")
        cpu_us.append((c1 - c0) / n * 1e6)
        wall.append(t1 - t0)
    out: Dict[str, Any] = {"cpu_us": cpu_us, "wall_s": wall}
    if hasattr(run, "reads"):
        out["reads_per_token"] = run.reads / (n * spec["repeats"])  # type: ignore[attr-defined]
    print(json.dumps(out))


def _in_fresh_process(spec: Dict[str, Any]) -> Dict[str, Any]:
    code = f"import sys; sys.path.append({ROOT!r}); from bench.paced import _worker; _worker()"
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], cwd=os.path.join(ROOT, "bench"),
                         capture_output=True, text=True, check=False, env=env, timeout=600)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-600:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(upstream_port: int, tokens: int = 1500, repeats: int = 3, rate: float = RATE) -> Dict[str, Any]:
    rows: Dict[str, Any] = {}
    for key, _ in READERS:
        spec = {"port": upstream_port, "reader": key, "tokens": tokens, "rate": rate, "repeats": repeats}
        row = _in_fresh_process(spec)
        if "cpu_us" in row:
            row["cpu_us_spread"] = spread(row["cpu_us"])
        rows[key] = row
    return {"tokens": tokens, "rate": rate, "repeats": repeats, "readers": rows}
