"""A small Python client of served runs (``make_wsgi_app(runs=...)``): it resumes a run the way EventSource does.

It starts a run with ``POST /v1/chat/stream``, and whenever the connection
ends before the run's terminal frame it waits the server's ``retry:``
milliseconds and reconnects to ``GET /v1/runs/<id>/events`` with the last
``id:`` it got as ``Last-Event-ID``, so every frame arrives once, in order,
whichever worker answers.  It stops at the terminal frame (``done``, or a
fatal ``error``), at a ``204`` (the run ended and it has the terminal), or
after ``max_reconnects`` reconnects in a row without a new frame.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import requests

from .._errors import StreamEngineError

#: What the server sends first; used until a stream says otherwise.
DEFAULT_RETRY_MS = 1000


class RunClientError(StreamEngineError):
    """The server refused the run or could not be reached for longer than the client reconnects."""


@dataclass(frozen=True)
class RunEvent:
    """One event of a run as a client sees it: ``id`` (``<run_id>.<seq>``, None for ``gap``), ``event``, ``data``."""

    id: Optional[str]
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)

    @property
    def terminal(self) -> bool:
        if self.event == "done":
            return True
        if self.event != "error":
            return False
        payload = self.json()
        return isinstance(payload, dict) and payload.get("fatal") is True and "code" in payload


class RunClient:
    """Starts, follows, stops and answers runs of a streamengine server at ``base_url``.

    ``headers`` go with every request (a session cookie, an API key); each
    read waits at most ``timeout_s``.  :attr:`run_id` and
    :attr:`last_event_id` say where the client is, for a reconnect after a
    restart of your own (:meth:`follow`).
    """

    def __init__(self, base_url: str, *, headers: Optional[Mapping[str, str]] = None, timeout_s: float = 30.0,
                 max_reconnects: int = 10, session: Optional[requests.Session] = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers: Dict[str, str] = dict(headers or {})
        self.timeout_s = timeout_s
        self.max_reconnects = max_reconnects
        self.session = session if session is not None else requests.Session()
        self.run_id: Optional[str] = None
        self.last_event_id: Optional[str] = None
        self.retry_ms = DEFAULT_RETRY_MS
        self.reconnects = 0
        self._last_problem: Union[BaseException, str, None] = None  # why the last reconnect brought nothing

    # --- runs ---------------------------------------------------------------------------------
    def start(self, messages: List[Mapping[str, Any]]) -> Iterator[RunEvent]:
        """A new run of ``messages``: its events until the terminal one, reconnecting as needed."""
        response = self.session.post(f"{self.base_url}/v1/chat/stream", json={"messages": list(messages)},
                                     headers=self.headers, stream=True, timeout=self.timeout_s)
        self._check(response, "start a run")
        self.run_id = response.headers.get("X-Run-Id")
        if not self.run_id:
            response.close()
            raise RunClientError("the server answered without X-Run-Id: it serves runs only with "
                                 "make_wsgi_app(runs=...) (streamengine serve --runs URL)")
        self.last_event_id = None
        return self._events(response)

    def follow(self, run_id: str, last_event_id: Optional[str] = None) -> Iterator[RunEvent]:
        """The events of a run after ``last_event_id`` (all of them without one), until the terminal one."""
        self.run_id, self.last_event_id = run_id, last_event_id
        return self._events(None)

    def stop(self, run_id: Optional[str] = None) -> None:
        """Ask the run to stop (``POST /v1/runs/<id>/stop``): it ends with ``done`` and ``cancel_reason: stopped``."""
        self._check(self.session.post(self._run_url(run_id, "/stop"), headers=self.headers, timeout=self.timeout_s),
                    "stop the run")

    def status(self, run_id: Optional[str] = None) -> Dict[str, Any]:
        """``GET /v1/runs/<id>``: the state, and once done the answer."""
        response = self.session.get(self._run_url(run_id, ""), headers=self.headers, timeout=self.timeout_s)
        self._check(response, "read the run's status")
        status: Dict[str, Any] = response.json()
        return status

    def answer(self, call_id: str, approved: bool, reason: str = "", run_id: Optional[str] = None) -> bool:
        """Approve or refuse a held call (an ``approval_request``); the first answer given, which is what counts."""
        response = self.session.post(self._run_url(run_id, f"/approvals/{call_id}"), headers=self.headers,
                                     json={"approved": approved, "reason": reason}, timeout=self.timeout_s)
        self._check(response, "answer the approval request")
        return bool(response.json()["approved"])

    # --- the stream ---------------------------------------------------------------------------
    def _events(self, response: Optional[requests.Response]) -> Iterator[RunEvent]:
        fruitless = 0
        while True:
            ended = False
            if response is None:
                response, ended = self._reconnect()
            if ended:
                return  # 204: the run ended and this client has its terminal frame
            got_any = False
            if response is not None:
                try:
                    for event in self._read(response):
                        got_any = True
                        yield event
                        if event.terminal:
                            return
                except requests.RequestException as exc:  # the connection broke: reconnect below
                    self._last_problem = exc
                finally:
                    response.close()
            response = None
            fruitless = 0 if got_any else fruitless + 1
            if fruitless > self.max_reconnects:
                last = self._last_problem
                raise RunClientError(f"run {self.run_id}: {fruitless} reconnects in a row brought nothing (the last: "
                                     f"{last}); the server may be down; follow it again later with "
                                     "RunClient.follow()") from (last if isinstance(last, BaseException) else None)
            time.sleep(self.retry_ms / 1000)

    def _reconnect(self) -> Tuple[Optional[requests.Response], bool]:
        """The resumed stream (None: no answer, a 5xx or 429: try again), and whether the run ended (204)."""
        self.reconnects += 1
        headers = dict(self.headers, Accept="text/event-stream")
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        try:
            response = self.session.get(self._run_url(None, "/events"), headers=headers, stream=True,
                                        timeout=self.timeout_s)
        except requests.RequestException as exc:
            self._last_problem = exc
            return None, False
        if response.status_code == 204:
            response.close()
            return None, True
        if response.status_code >= 500 or response.status_code == 429:
            self._last_problem = f"HTTP {response.status_code}"
            response.close()
            return None, False
        self._check(response, "resume the run")
        return response, False

    def _read(self, response: requests.Response) -> Iterator[RunEvent]:
        """The events of one response by the event-stream rules; ``retry:`` and ``id:`` remembered."""
        fields: Dict[str, str] = {}
        for raw in response.iter_lines(chunk_size=None, decode_unicode=False):
            line = raw.decode("utf-8")
            if line == "":
                if "data" in fields and fields["data"] != "[DONE]":
                    if "id" in fields:
                        self.last_event_id = fields["id"]
                    yield RunEvent(fields.get("id"), fields.get("event", "message"), fields["data"])
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "retry" and value.isdigit():
                    self.retry_ms = int(value)
                elif name == "data" and "data" in fields:
                    fields["data"] += "\n" + value
                else:
                    fields[name] = value

    def _run_url(self, run_id: Optional[str], tail: str) -> str:
        run_id = run_id or self.run_id
        if not run_id:
            raise RunClientError("no run yet: start() one, or pass run_id")
        return f"{self.base_url}/v1/runs/{run_id}{tail}"

    @staticmethod
    def _check(response: requests.Response, doing: str) -> None:
        if response.status_code < 400:
            return
        try:
            detail = response.json().get("error", "")
        except ValueError:
            detail = response.text[:200]
        response.close()
        raise RunClientError(f"could not {doing}: HTTP {response.status_code}: {detail}")

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> RunClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
