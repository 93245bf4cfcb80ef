"""What the web tests share: an app served by waitress, WSGI calls through wsgiref's validator, SSE read
back, engine stand-ins.
"""
from __future__ import annotations

import io
import json
import threading
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import requests
import sseclient
import waitress
from waitress import wasyncore

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

HOSTILE = [
    "\n\nevent: tool_result\ndata: {}\n\n",
    "carriage\rreturn\r\n",
    "line\u2028separator\u2029para",
    "nul\x00byte",
    "data: [DONE]\n\n",
    ": comment\nid: 7\nretry: 1\n",
    "\ufeffbom and \U0001F600 emoji",
]


# A lone surrogate can only arrive JSON-escaped (it has no UTF-8 form); browsers keep it as is.
LONE_SURROGATE = "lone \ud83d surrogate"


LONE_SURROGATE_FRAME = s.raw(b'data: {"choices":[{"index":0,"delta":{"content":"lone \\ud83d surrogate"}}]}\n\n')


def make_engine(fp: FakeProvider, tools=(), **config) -> StreamingEngine:
    config.setdefault("models", ["m1"])
    config.setdefault("idle_timeout", 5.0)
    config.setdefault("completion_timeout", 10.0)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config))


def block(name: str, args: Optional[dict] = None) -> str:
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


@contextmanager
def serving(app, threads: int = 8, **options) -> Iterator[str]:
    """Run ``app`` under waitress on a free port; stop every waitress thread on exit.

    ``server.close()`` alone only closes the listening socket of a single-socket
    server: open channels keep the loop running and the task threads wait.  So
    the channels are closed inside the loop thread (a trigger thunk), the task
    threads are shut down while the trigger still works (a finishing task pulls
    it), and then the trigger and the server close, which ends the loop.
    """
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=threads, **options)
    loop = threading.Thread(target=server.run, name="waitress-loop", daemon=True)
    loop.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.trigger.pull_trigger(lambda: _close_channels_and_listener(server))
        server.task_dispatcher.shutdown(timeout=5)
        try:
            server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map, ignore_all=True))
        except OSError:  # the trigger is gone already: the loop has nothing left to serve
            wasyncore.close_all(server._map, ignore_all=True)
        loop.join(5)
        assert not loop.is_alive(), "waitress's loop outlived the test"


def _close_channels_and_listener(server) -> None:
    """Close the client channels (this wakes task threads blocked writing to them) and the listener.

    The trigger stays: the server's own ``close()`` would close it too, so the listener closes as a plain
    dispatcher.
    """
    for dispatcher in list(server._map.values()):
        try:
            if hasattr(dispatcher, "write_soon"):
                dispatcher.handle_close()
            elif dispatcher is server:
                wasyncore.dispatcher.close(server)
        except OSError:
            pass


def read1_pieces(resp: requests.Response) -> Iterator[bytes]:
    """What has arrived, as it arrives (iter_content(n) would wait to fill n bytes)."""
    while True:
        data = resp.raw.read1(65536)
        if not data:
            return
        yield data


def sse(resp: requests.Response, pieces: Optional[Iterator[bytes]] = None) -> List[Tuple[str, str]]:
    """All events of a response as (type, data) with sseclient-py."""
    client = sseclient.SSEClient(pieces if pieces is not None else read1_pieces(resp))
    return [(e.event, e.data) for e in client.events()]


def tokens_of(events) -> List[str]:
    return [json.loads(data) for kind, data in events if kind == "message" and data != "[DONE]"]


def kinds(events) -> List[str]:
    return [kind if data != "[DONE]" else "[DONE]" for kind, data in events]


def environ_for(method: str = "GET", path: str = "/", body: bytes = b"", query: str = "",
                content_type: str = "application/json", **extra) -> dict:
    env: dict = {}
    setup_testing_defaults(env)
    env.update({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                "CONTENT_TYPE": content_type, "CONTENT_LENGTH": str(len(body)),
                "wsgi.input": io.BytesIO(body)})
    env.update(extra)
    return env


#: What the page's EventSource sends, and a GET run must ask for (a link, a tag or a navigation asks for others).
STREAM_ACCEPT = {"Accept": "text/event-stream"}


def get_run(query: str, **extra) -> dict:
    """The environ of a GET run asked the way EventSource (or a client of your own) asks for it."""
    return environ_for("GET", "/v1/chat/stream", query=query, HTTP_ACCEPT="text/event-stream", **extra)


def call(app, environ: dict) -> Tuple[str, dict, bytes]:
    """Drive ``app`` (wrapped in wsgiref's validator) like a server would: iterate, then close."""
    got: dict = {}

    def start_response(status, headers, exc_info=None):
        got["status"], got["headers"] = status, headers

    body = validator(app)(environ, start_response)
    try:
        data = b"".join(body)
    finally:
        body.close()
    return got["status"], dict(got["headers"]), data


class Silent:
    """An engine stand-in whose runs end at once without events."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, messages, cancel=None, *, heartbeat_s=None):
        self.runs += 1
        return iter(())


class Unused:
    """An engine stand-in for requests refused before any run starts."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, *args, **kwargs):
        self.runs += 1
        raise AssertionError("run() must not be called for a refused request")


class CutAfter:
    """WSGI middleware ending every run stream after ``writes`` writes, the way a proxy's timeout would."""

    def __init__(self, app, writes: int) -> None:
        self.app, self.writes, self.cuts = app, writes, 0

    def __call__(self, environ, start_response):
        body = self.app(environ, start_response)
        if "/v1/chat/stream" not in environ["PATH_INFO"] and not environ["PATH_INFO"].endswith("/events"):
            return body
        return self._cut(body)

    def _cut(self, body):
        try:
            for index, chunk in enumerate(body):
                yield chunk
                if index + 1 >= self.writes:
                    self.cuts += 1
                    return
        finally:
            if hasattr(body, "close"):
                body.close()
