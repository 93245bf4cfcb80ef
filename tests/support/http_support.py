"""What the client and transport tests share: a FakeProvider and a client on it, a cancel probe.

Take the fixtures into a test module with::

    fp, client = provider_fixtures("anthropic", api_key="sk-ant-test")

(pytest finds fixtures by the module's names, so the two names must be
``fp`` and ``client``).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from streamengine import AnthropicClient, Chunk, OpenAICompatibleClient
from streamengine.testing import FakeProvider

FRAMINGS = ["chunked", "close", "length"]
MESSAGES = [{"role": "user", "content": "hi"}]
CLIENTS = {"openai": OpenAICompatibleClient, "anthropic": AnthropicClient}


def provider_fixtures(wire: str = "openai", api_key: Optional[str] = None) -> Tuple[Any, Any]:
    """The ``fp`` fixture (a FakeProvider speaking ``wire``) and the ``client`` fixture on it."""

    @pytest.fixture(name="fp")
    def provider() -> Iterator[FakeProvider]:
        with FakeProvider(wire=wire) as fake:
            yield fake

    @pytest.fixture(name="client")
    def client_on_provider(fp: FakeProvider) -> Iterator[Any]:
        with CLIENTS[wire](fp.base_url, api_key=api_key) as client:
            yield client

    return provider, client_on_provider


def text_of(chunks: List[Chunk]) -> str:
    return "".join(c.content or "" for c in chunks)


def busy_connection_threads(fp: FakeProvider, wait_s: float = 5.0) -> List[str]:
    """The provider's connection threads and our cancel watchers still alive after waiting up to ``wait_s``.

    Empty once the client gave its connection back (the server's handler
    ends when the client closes the socket).
    """
    def busy() -> List[str]:
        return [t.name for t in threading.enumerate()
                if t.name in (f"FakeProvider-{fp.port}-conn", "streamengine-cancel-watch")]

    deadline = time.monotonic() + wait_s
    while busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    return busy()


def cancel_while_blocked(fp: FakeProvider, cancel: Any, call: Callable[[], Any],
                         ready: Optional[threading.Event] = None) -> Tuple[Optional[BaseException], float]:
    """Run ``call`` in a thread, cancel once it is blocked; return (error, seconds to unblock).

    Blocked means: ``ready`` is set, or (without ``ready``) the provider got the request.
    The provider stalls for good, so the reader returning at all (the join's wide
    guard) proves the cancel unblocked it; how fast is measured nowhere in tests.
    """
    outcome: dict = {}

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome["error"], outcome["at"] = exc, time.monotonic()

    thread = threading.Thread(target=run, name="test-reader")
    thread.start()
    if ready is not None:
        assert ready.wait(5)
    else:
        assert fp.wait_for_requests(1, 5)
    time.sleep(0.05)  # let the reader settle into its blocking read
    cancelled_at = time.monotonic()
    cancel.set()
    thread.join(10.0)
    assert not thread.is_alive(), "cancel did not unblock the read"
    return outcome.get("error"), outcome["at"] - cancelled_at
