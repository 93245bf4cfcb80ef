"""``serve`` sets waitress's limits: connections, request body, output buffer, idle channels.

Each test runs the real ``serve_app`` (waitress) on 127.0.0.1 in a thread
and talks to it with raw sockets, the way a slow or hostile client does.
"""
from __future__ import annotations

import socket
from typing import List

import pytest
import requests
from conftest import wait_for
from serve_support import served

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine._config import DEFAULT_COMPLETION_TIMEOUT_S as DEFAULT_TIMEOUT_S
from streamengine.testing import FakeProvider
from streamengine.web import make_wsgi_app
from streamengine.web._serve import (
    CHANNEL_TIMEOUT_S,
    CONNECTION_LIMIT,
    CONNECTIONS_PER_CLIENT,
    OUTBUF_HIGH_WATERMARK,
    client_of,
    server_limits,
)

HALF_SENT = (b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{\"messages\"")


@pytest.fixture
def app():
    with FakeProvider() as fp:
        engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), config=EngineConfig(model="m"))
        try:
            yield make_wsgi_app(engine, max_streams=4)
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


def test_healthz_answers_while_120_connections_sit_half_sent(app, no_thread_leak):
    with served(app) as url:
        waiting = [sock for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4")
                   for sock in half_sent(port_of(url), 40, source)]
        try:
            health = requests.get(url + "healthz", timeout=10)
            assert health.status_code == 200 and health.json() == {"status": "ok"}
        finally:
            close_all(waiting)


def test_one_address_dribbling_headers_cannot_take_every_connection(app, no_thread_leak):
    with served(app, connection_limit=20, max_connections_per_client=5) as url:
        dribbling = half_sent(port_of(url), 5)
        try:
            assert refusal(port_of(url)).startswith(b"HTTP/1.1 429 "), "a sixth connection from one address"
            assert healthz_from(port_of(url), "127.0.0.2").startswith(b"HTTP/1.1 200 ")  # another client is served
        finally:
            close_all(dribbling)
        # Once the server has seen the closes, the address is served again.
        assert wait_for(lambda: healthz_from(port_of(url), "127.0.0.1").startswith(b"HTTP/1.1 200 "))


def test_by_default_one_address_holds_a_small_share_of_the_connections(app, no_thread_leak):
    assert CONNECTIONS_PER_CLIENT * 10 <= CONNECTION_LIMIT
    with served(app) as url:
        dribbling = half_sent(port_of(url), CONNECTIONS_PER_CLIENT)
        try:
            answer = refusal(port_of(url))
            assert answer.startswith(b"HTTP/1.1 429 ") and b"Retry-After: 5" in answer
            assert f"{CONNECTIONS_PER_CLIENT} open connections".encode() in answer
            assert healthz_from(port_of(url), "127.0.0.2").startswith(b"HTTP/1.1 200 ")
        finally:
            close_all(dribbling)


@pytest.mark.parametrize("address,client", [
    ("192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),   # one IPv6 host has a /64 to pick addresses from
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_a_client_is_its_ipv4_address_or_its_ipv6_64(address, client):
    assert client_of((address, 1234)) == client


def test_past_the_connection_limit_a_client_is_refused_not_left_hanging(app, no_thread_leak):
    with served(app, connection_limit=4) as url:
        waiting = half_sent(port_of(url), 4)
        try:
            extra = socket.create_connection(("127.0.0.1", port_of(url)), timeout=10)
            with extra:
                try:
                    answer = extra.recv(4096)  # the refusal comes without our sending anything
                except ConnectionResetError:  # the kernel may turn the close into a reset: still refused
                    answer = b"reset"
            assert answer.startswith(b"HTTP/1.1 503 ") or answer == b"reset", answer
        finally:
            close_all(waiting)
        # Below the limit again (once the server has seen the closes), it serves as before.
        assert wait_for(lambda: requests.get(url + "healthz", timeout=10).status_code == 200)


def test_a_body_over_the_apps_cap_is_refused_before_it_is_read(app, no_thread_leak):
    with served(app) as url:
        with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 200000000\r\n\r\n{")
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413 "), answer


def test_server_limits_follow_the_app_and_bound_buffers(app):
    limits = server_limits(app, threads=8)
    assert limits["max_request_body_size"] == app.max_body_bytes
    assert limits["outbuf_high_watermark"] == OUTBUF_HIGH_WATERMARK == 1 << 20
    assert limits["channel_timeout"] == CHANNEL_TIMEOUT_S and limits["asyncore_use_poll"] is True
    assert limits["connection_limit"] > 100 * 8  # well above any stream cap of an 8-thread server


def test_cli_timeout_default_is_the_librarys():
    assert EngineConfig(model="m").completion_timeout == DEFAULT_TIMEOUT_S


@pytest.mark.parametrize("flag, refused", [("2", True), ("0", False)])
def test_serve_flag_sets_the_per_client_connection_cap(capsys, flag, refused, no_thread_leak):
    import threading

    from streamengine._cli.main import main

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
