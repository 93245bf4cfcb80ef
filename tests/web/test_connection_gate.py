"""The connection gate in front of waitress: clients by address, the connection limit, the limits table.

This module tests a private algorithm directly (``streamengine.web._serve``):
how an address maps to a client (an IPv6 host owns its /64), which cannot be
reached from 127.0.0.1, and the connection limit and waitress settings,
which ``serve`` does not take as arguments (reaching the limit through it
would take some thousand sockets).  Everything a client sees of the limits is
in test_serve_limits.py, through the public ``serve``.
"""
from __future__ import annotations

import contextlib
import io
import queue
import socket
import threading
from typing import Iterator, List

import pytest
import requests
from conftest import wait_for

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.web import make_wsgi_app
from streamengine.web._serve import (
    CHANNEL_TIMEOUT_S,
    CONNECTION_LIMIT,
    CONNECTIONS_PER_CLIENT,
    OUTBUF_HIGH_WATERMARK,
    client_of,
    serve_app,
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


@contextlib.contextmanager
def served_app(app, **options) -> Iterator[str]:
    """``serve_app(app, ...)`` (what ``serve`` runs) on a free port in a thread, with its private options."""
    stop, urls = threading.Event(), queue.Queue()
    thread = threading.Thread(target=serve_app, args=(app,), name="test-connection-gate", kwargs=dict(
        host="127.0.0.1", port=0, threads=8, out=io.StringIO(), stop=stop, ready=urls.put, **options))
    thread.start()
    try:
        yield urls.get(timeout=10)
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive()


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def half_sent(port: int, count: int) -> List[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(HALF_SENT)
        sockets.append(sock)
    return sockets


@pytest.mark.parametrize("address,client", [
    ("192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),   # one IPv6 host has a /64 to pick addresses from
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_a_client_is_its_ipv4_address_or_its_ipv6_64(address, client):
    assert client_of((address, 1234)) == client


def test_by_default_one_address_holds_a_small_share_of_the_connection_limit():
    assert CONNECTIONS_PER_CLIENT * 10 <= CONNECTION_LIMIT


def test_past_the_connection_limit_a_client_is_refused_not_left_hanging(app, no_thread_leak):
    with served_app(app, connection_limit=4) as url:
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
            for sock in waiting:
                sock.close()
        # Below the limit again (once the server has seen the closes), it serves as before.
        assert wait_for(lambda: requests.get(url + "healthz", timeout=10).status_code == 200)


def test_server_limits_follow_the_app_and_bound_buffers(app):
    limits = server_limits(app, threads=8)
    assert limits["max_request_body_size"] == app.max_body_bytes
    assert limits["outbuf_high_watermark"] == OUTBUF_HIGH_WATERMARK == 1 << 20
    assert limits["channel_timeout"] == CHANNEL_TIMEOUT_S and limits["asyncore_use_poll"] is True
    assert limits["connection_limit"] > 100 * 8  # well above any stream cap of an 8-thread server
