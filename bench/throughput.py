"""1. Throughput: 100k OpenAI chunks through each way of reading a stream, same server, same run.

Every reader does the minimum useful work: parse each frame and collect the
content text; each run is checked to have produced the whole answer.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, List, Tuple

from .common import Server, answer_of, content_frame, finish_frames, raw_read, seg

TOKEN = " word"
MESSAGES = [{"role": "user", "content": "benchmark"}]


def register(server: Server, name: str, n: int, token: str = TOKEN) -> str:
    return server.script(name, [seg(content_frame(token), repeat=n), seg(finish_frames())])


# --- the readers --------------------------------------------------------------------------

def raw_socket(server: Server, model: str, decoder: str = "scan_once") -> str:
    """The Python limit: see :func:`bench.common.raw_read`."""
    return raw_read(server.port, model, MESSAGES, decoder)[0]


def make_requests_sseclient(server: Server) -> Callable[[str], str]:
    import requests
    import sseclient
    session = requests.Session()
    url = server.base_url + "/chat/completions"

    def run(model: str) -> str:
        resp = session.post(url, json={"model": model, "messages": MESSAGES, "stream": True}, stream=True,
                            headers={"Accept": "text/event-stream"})
        try:
            return answer_of(event.data for event in sseclient.SSEClient(resp).events())
        finally:
            resp.close()

    return run


def make_openai_sdk(server: Server) -> Callable[[str], str]:
    from openai import OpenAI
    client = OpenAI(base_url=server.base_url, api_key="bench", max_retries=0)

    def run(model: str) -> str:
        parts = []
        for chunk in client.chat.completions.create(model=model, messages=MESSAGES, stream=True):
            if chunk.choices:
                content = chunk.choices[0].delta.content
                if content:
                    parts.append(content)
        return "".join(parts)

    return run


def make_client_stream(server: Server) -> Callable[[str], str]:
    from streamengine import CompletionOptions, OpenAICompatibleClient
    client = OpenAICompatibleClient(server.base_url)

    def run(model: str) -> str:
        parts = []
        for chunk in client.stream(MESSAGES, options=CompletionOptions(model=model)):
            if chunk.content:
                parts.append(chunk.content)
        return "".join(parts)

    return run


def make_strategy(server: Server) -> Callable[[str], str]:
    from streamengine import CompletionOptions, OpenAICompatibleClient
    from streamengine._calls.strategies import StreamingCallStrategy
    from streamengine._wait import drive
    strategy = StreamingCallStrategy(OpenAICompatibleClient(server.base_url))

    def run(model: str) -> str:
        return drive(strategy.stream_call(MESSAGES, options=CompletionOptions(model=model))).content

    return run


def bench_tool(query: str) -> str:
    """A registered tool, so the inline parser is on (it is never called here)."""
    return query


def make_engine(server: Server) -> Tuple[Callable[[str], str], Callable[[], None]]:
    """``StreamingEngine.complete`` with one registered tool and tool_mode "inline": the parser is on."""
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    engines: Dict[str, Any] = {}  # an engine serves one model list: one per script

    def run(model: str) -> str:
        engine = engines.get(model)
        if engine is None:
            engine = engines[model] = StreamingEngine(
                OpenAICompatibleClient(server.base_url), [tool(bench_tool)],
                EngineConfig(models=[model], tool_mode="inline", completion_timeout=600.0))
        result = engine.complete(MESSAGES)
        if result.error:
            raise RuntimeError(result.error)
        return result.answer

    def close() -> None:
        for engine in engines.values():
            engine.close()

    return run, close


# --- the benchmark ---------------------------------------------------------------------------

READERS = [
    ("raw", "raw socket + split + scan_once (the limit)"),
    ("raw_loads", "the same reader with json.loads"),
    ("requests_sseclient", "requests + sseclient-py"),
    ("openai_sdk", "openai SDK stream=True"),
    ("client", "OpenAICompatibleClient.stream"),
    ("strategy", "StreamingCallStrategy.call"),
    ("engine", "StreamingEngine.complete (xml parser on)"),
]


def run(server: Server, n: int = 100_000, repeats: int = 3, sdk_repeats: int = 3,
        only: Any = None, processes: int = 1) -> Dict[str, Any]:
    """``repeats`` rounds of every reader, interleaved, in each of ``processes`` fresh processes.

    One process's level varies by +-10% for the threaded readers (where its
    threads land, memory layout): several processes, and the median of all
    their runs, give the figure a fresh process would show.  The openai SDK
    (8 s a run) is run ``sdk_repeats`` times, in the first process only.
    """
    model = register(server, f"throughput-{n}", n)
    warm = register(server, "throughput-warm", 2000)
    if processes <= 1:
        times = measure(server, model, warm, n, repeats, sdk_repeats, only)
    else:
        times = {}
        for i in range(processes):
            spec = {"port": server.port, "model": model, "warm": warm, "n": n, "repeats": repeats,
                    "sdk_repeats": sdk_repeats if i == 0 else 0, "only": only}
            for key, values in _in_fresh_process(spec).items():
                times.setdefault(key, []).extend(values)
    return {"n": n, "times": times, "processes": processes}


def measure(server: Any, model: str, warm: str, n: int, repeats: int, sdk_repeats: int,
            only: Any = None) -> Dict[str, List[float]]:
    """Seconds per run of each reader on ``model`` (whose answer is ``n`` tokens)."""
    expected = TOKEN * n
    engine_run, close_engines = make_engine(server)
    runners: Dict[str, Callable[[str], str]] = {
        "raw": lambda m: raw_socket(server, m),
        "raw_loads": lambda m: raw_socket(server, m, "loads"),
        "requests_sseclient": make_requests_sseclient(server),
        "client": make_client_stream(server),
        "strategy": make_strategy(server),
        "engine": engine_run,
    }
    if sdk_repeats:
        try:
            runners["openai_sdk"] = make_openai_sdk(server)
        except ImportError:
            pass
    if only:
        runners = {k: v for k, v in runners.items() if k in only or k == "raw"}
    times: Dict[str, List[float]] = {k: [] for k in runners}
    try:
        for fn in runners.values():  # warm-up: connections, imports, caches
            fn(warm)
        for rep in range(repeats):
            for key, fn in runners.items():
                if key == "openai_sdk" and rep >= sdk_repeats:
                    continue
                t0 = time.perf_counter()
                answer = fn(model)
                elapsed = time.perf_counter() - t0
                if answer != expected:
                    raise RuntimeError(f"throughput/{key}: got {len(answer)} chars, expected {len(expected)}")
                times[key].append(elapsed)
        for _ in range(repeats, sdk_repeats):  # the SDK's runs beyond the shared rounds
            if "openai_sdk" in runners:
                t0 = time.perf_counter()
                runners["openai_sdk"](model)
                times["openai_sdk"].append(time.perf_counter() - t0)
    finally:
        close_engines()
    return times


class _Remote:
    """The parts of :class:`Server` the readers use, for a server another process started."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"


def _in_fresh_process(spec: Dict[str, Any]) -> Dict[str, List[float]]:
    import os
    import subprocess
    import sys

    from .common import ROOT
    # -c from the bench folder: streamengine is found as in this process (PYTHONPATH
    # or the installed package), ROOT only supplies the bench package.
    code = (f"import sys; sys.path.append({ROOT!r}); "
            f"from bench.throughput import _worker; _worker()")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], cwd=os.path.join(ROOT, "bench"),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"throughput worker failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _worker() -> None:
    import gc
    import sys

    from .common import quiet_logs
    spec = json.loads(sys.argv[1])
    quiet_logs()
    import requests  # noqa: F401 - imported before the freeze, like the harness

    import streamengine  # noqa: F401
    if spec["sdk_repeats"]:
        try:
            import openai  # noqa: F401
        except ImportError:
            pass
    gc.collect()
    gc.freeze()  # see bench/__main__.py: collections scan what is measured, not the harness
    times = measure(_Remote(spec["port"]), spec["model"], spec["warm"], spec["n"], spec["repeats"],
                    spec["sdk_repeats"], spec["only"])
    print(json.dumps(times))
