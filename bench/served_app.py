"""The served apps of section 7: the engine's WSGI app, or a minimal relay, for waitress or gunicorn.

Configured from the environment, so gunicorn can load it as ``bench.served_app:app``:

* ``BENCH_UPSTREAM``: the upstream's base URL (bench/upstream.py), ``BENCH_MODEL``: what it streams;
* ``BENCH_APP``: ``engine`` (``make_wsgi_app`` over ``StreamingEngine``, as ``streamengine serve``
  runs it) or ``relay`` (the baseline: requests -> a WSGI generator yielding SSE bytes, no engine);
* ``BENCH_GC_FILE`` (optional): where :class:`CollectorClock` keeps the collector's CPU for the bench;
* ``BENCH_RUNS_URL`` (optional, section 16): the engine app with ``runs=open_run_log(url)``; a fragment
  ``#name=number,...`` passes options to the log (``#group_delay_s=0``), ``append_window_s`` and
  ``take_over`` to the app.

The relay is the least a served stream can cost in this stack: one requests
session per server thread, one read per upstream chunk, ``scan_once`` per
frame, and the token re-encoded as the engine app encodes it (``data: "<json
string>"``).  What the engine app spends beyond it is the engine.

``python -m bench.served_app THREADS`` runs it under waitress, prints ``PORT <n>``
and serves until stdin closes.
"""
from __future__ import annotations

import gc
import hashlib
import json
import mmap
import os
import struct
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator

_local = threading.local()
MAX_SESSIONS = 1000  # the app's stream caps: above any level section 7 or 8 opens


def _session() -> Any:
    session = getattr(_local, "session", None)
    if session is None:
        import requests
        session = _local.session = requests.Session()
    return session


def _relay_frames(resp: Any) -> Iterator[bytes]:
    scan = json.JSONDecoder().scan_once
    dumps = json.dumps
    pending = b""
    try:
        yield b": ok\n\n"
        for data in resp.iter_content(chunk_size=None):
            complete, _, pending = (pending + data).rpartition(b"\n")
            if not complete:
                continue
            out = []
            for line in complete.decode("utf-8").split("\n"):
                if line[:6] != "data: " or line == "data: [DONE]":
                    continue
                choices = scan(line, 6)[0]["choices"]
                if choices:
                    content = choices[0]["delta"].get("content")
                    if content:
                        out.append("data: " + dumps(content) + "\n\n")
            if out:
                yield "".join(out).encode("utf-8")
        yield b"event: done\ndata: {}\n\ndata: [DONE]\n\n"
    finally:
        resp.close()


def make_relay(upstream: str, model: str) -> Callable[..., Iterable[bytes]]:
    url = upstream + "/chat/completions"

    def relay(environ: Any, start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [b'{"status": "ok"}']
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        messages = json.loads(body)["messages"]
        resp = _session().post(url, json={"model": model, "messages": messages, "stream": True},
                               stream=True, timeout=60)
        start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])
        return _relay_frames(resp)

    return relay


def make_engine_app(upstream: str, model: str, runs_url: str = "") -> Any:
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    from streamengine.wsgi import make_wsgi_app

    @tool(name="lookup")
    def lookup(query: str) -> str:
        """Never called here: registered so the inline parser is on, as in a real deployment."""
        return f"found {query}"

    engine = StreamingEngine(OpenAICompatibleClient(upstream), [lookup],
                             EngineConfig(models=[model], tool_mode="inline", pool_size=16))
    # every session comes from 127.0.0.1: the caps must admit the most sessions a level opens (200)
    options: Any = {}
    if runs_url:  # section 16: the same app with its runs in a log (bench/runs.py)
        from streamengine.runs import open_run_log
        url, _, extra = runs_url.partition("#")  # bench/runs.py's variants: "#group_delay_s=0"
        kwargs = {key: float(value) for key, _, value in (item.partition("=") for item in extra.split(",") if item)}
        app_options = {key: kwargs.pop(key) for key in ("append_window_s", "take_over") if key in kwargs}
        if "take_over" in app_options:
            app_options["take_over"] = bool(app_options["take_over"])
        options = {"runs": open_run_log(url, **_runs_namespace(url), **kwargs), "on_disconnect": "cancel",
                   **app_options}
    return make_wsgi_app(engine, heartbeat_s=15.0, max_streams=MAX_SESSIONS, max_streams_per_client=MAX_SESSIONS,
                         **options)


def _runs_namespace(url: str) -> Any:
    """A key prefix or table of this app's own, so apps of one bench run do not share runs.

    Named after the app's clock file, not the process: a gunicorn worker
    that replaces a killed one must find the runs its predecessor left.
    """
    app = hashlib.sha256(os.environ.get("BENCH_GC_FILE", str(os.getpid())).encode()).hexdigest()[:12]
    if url.startswith("redis"):
        return {"prefix": f"bench:{app}:"}
    if url.startswith("postgres"):
        return {"table": f"bench_runs_{app}"}
    return {}


class CollectorClock:
    """CPU the garbage collector took in this process (``gc.callbacks``): section 7's ``gc`` column.

    A collection runs in the thread whose allocation set it off, holding the
    GIL from start to stop, so that thread's CPU clock times it.  The total is
    kept in an 8-byte memory-mapped file (``BENCH_GC_FILE``) that the bench
    reads with :meth:`read`: no request to a server whose threads may all be
    busy.  One worker process per file (section 7 runs gunicorn with one).
    """

    _LAYOUT = struct.Struct("d")

    def __init__(self, path: str) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), self._LAYOUT.size)
        self.cpu_s = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: Any) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.cpu_s += time.thread_time() - self._started
            self._LAYOUT.pack_into(self._map, 0, self.cpu_s)

    @classmethod
    def new_file(cls, prefix: str) -> str:
        """A file for one app's clock, reading 0 s until the app writes it (the caller removes it)."""
        import tempfile
        with tempfile.NamedTemporaryFile(prefix=prefix, delete=False) as f:
            f.write(cls._LAYOUT.pack(0.0))
        return f.name

    @classmethod
    def read(cls, path: str) -> float:
        with open(path, "rb") as f:
            return cls._LAYOUT.unpack(f.read(cls._LAYOUT.size))[0]


def _make() -> Any:
    import logging

    from loguru import logger
    logger.disable("streamengine")
    # "Task queue depth is N" on every request once all threads are busy: the table shows that state
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    upstream, model = os.environ["BENCH_UPSTREAM"], os.environ["BENCH_MODEL"]
    kind = os.environ.get("BENCH_APP", "engine")
    if os.environ.get("BENCH_GC_FILE"):
        gc.callbacks.append(CollectorClock(os.environ["BENCH_GC_FILE"]))
    if kind == "relay":
        return make_relay(upstream, model)
    return make_engine_app(upstream, model, os.environ.get("BENCH_RUNS_URL", ""))


app = _make() if "BENCH_UPSTREAM" in os.environ else None


def main() -> None:
    from waitress.server import create_server

    from bench.common import announce_and_serve
    threads = int(sys.argv[1])
    server = create_server(app, host="127.0.0.1", port=0, threads=threads, connection_limit=threads + 100,
                           backlog=2048, channel_request_lookahead=1, ident="streamengine-bench")
    announce_and_serve(server.effective_port, server.run)


if __name__ == "__main__":
    main()
