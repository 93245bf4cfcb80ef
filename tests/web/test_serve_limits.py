"""``serve`` sets waitress's limits: connections, request body, output buffer, idle channels.

Each test runs the public ``serve`` (waitress) on 127.0.0.1 in a thread and
talks to it with raw sockets, the way a slow or hostile client does.  How the
server groups addresses into clients and the limits table it hands waitress
are checked in test_connection_gate.py.
"""
from __future__ import annotations

import inspect
import re
import socket
import threading
from typing import List

import pytest
import requests
from cli_support import main
from conftest import wait_for
from serve_support import served

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.web import serve

HALF_SENT = (b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{\"messages\"")

#: One address's open connections by default: ``serve``'s own default.
CONNECTIONS_PER_CLIENT = inspect.signature(serve).parameters["max_connections_per_client"].default


@pytest.fixture
def engine():
    with FakeProvider() as fp:
        engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), config=EngineConfig(model="m"))
        try:
            yield engine
        finally:
            engine.close()


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def half_sent(port: int, count: int, source: str = "127.0.0.1") -> List[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        sock.sendall(HALF_SENT)
        sockets.append(sock)
    return sockets


def refusal(port: int, source: str = "127.0.0.1") -> bytes:
    """What the server says to a connection that sends nothing: a refusal comes at once, unasked."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        try:
            return sock.recv(4096)
        except ConnectionResetError:  # the kernel may turn the close into a reset: still refused
            return b"reset"


def healthz_from(port: int, source: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        try:
            return sock.recv(4096)
        except ConnectionResetError:
            return b"reset"


def close_all(sockets: List[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def test_healthz_answers_while_120_connections_sit_half_sent(engine, no_thread_leak):
    with served(engine, max_streams=4) as url:
        waiting = [sock for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4")
                   for sock in half_sent(port_of(url), 40, source)]
        try:
            health = requests.get(url + "healthz", timeout=10)
            assert health.status_code == 200 and health.json() == {"status": "ok"}
        finally:
            close_all(waiting)


def test_one_address_dribbling_headers_cannot_take_every_connection(engine, no_thread_leak):
    with served(engine, max_streams=4, max_connections_per_client=5) as url:
        dribbling = half_sent(port_of(url), 5)
        try:
            assert refusal(port_of(url)).startswith(b"HTTP/1.1 429 "), "a sixth connection from one address"
            assert healthz_from(port_of(url), "127.0.0.2").startswith(b"HTTP/1.1 200 ")  # another client is served
        finally:
            close_all(dribbling)
        # Once the server has seen the closes, the address is served again.
        assert wait_for(lambda: healthz_from(port_of(url), "127.0.0.1").startswith(b"HTTP/1.1 200 "))


def test_by_default_one_address_holds_a_small_share_of_the_connections(engine, no_thread_leak):
    with served(engine, max_streams=4) as url:
        dribbling = half_sent(port_of(url), CONNECTIONS_PER_CLIENT)
        try:
            answer = refusal(port_of(url))
            assert answer.startswith(b"HTTP/1.1 429 ") and b"Retry-After: 5" in answer
            assert f"{CONNECTIONS_PER_CLIENT} open connections".encode() in answer
            assert healthz_from(port_of(url), "127.0.0.2").startswith(b"HTTP/1.1 200 ")
        finally:
            close_all(dribbling)


def test_a_body_over_the_apps_cap_is_refused_before_it_is_read(engine, no_thread_leak):
    with served(engine, max_streams=4) as url:
        with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 200000000\r\n\r\n{")
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413 "), answer


def test_cli_timeout_default_is_the_librarys(capsys):
    assert main(["chat", "--help"]) == 0
    shown = re.search(r"STREAMENGINE_TIMEOUT; default ([0-9.]+)", " ".join(capsys.readouterr().out.split()))
    assert shown and float(shown.group(1)) == EngineConfig(model="m").completion_timeout


@pytest.mark.parametrize("flag, refused", [("2", True), ("0", False)])
def test_serve_flag_sets_the_per_client_connection_cap(capsys, flag, refused, no_thread_leak):
    stop, seen = threading.Event(), {}

    def ready(url):
        port = port_of(url)
        dribbling = half_sent(port, 2)
        try:
            seen["answer"] = healthz_from(port, "127.0.0.1")
        finally:
            close_all(dribbling)
            stop.set()

    with FakeProvider() as fp:
        rc = main(["serve", "--port", "0", "--base-url", fp.base_url, "-m", "m",
                   "--max-connections-per-client", flag],
                  stop=stop, ready=lambda url: threading.Thread(target=ready, args=(url,)).start())
    assert rc == 0, capsys.readouterr().err
    assert seen["answer"].startswith(b"HTTP/1.1 429 " if refused else b"HTTP/1.1 200 ")
