"""Requests from a server to us, bounded: what one server can make the shared loop hold.

The SDK starts one task per request a server sends (``ping``, ``roots/list``,
``sampling/createMessage``...), and each holds on until its answer is
written.  A server that sends requests in a loop and stops reading its
stdin grew the loop by 16,000 tasks and 150 MB in 5 s.  The gate sits
between the transport and the session: at most :data:`MAX_SERVER_REQUESTS`
of a server's requests are open at once (answered, or cancelled by the
server, closes one); past it, further requests are dropped unanswered (the
server is not reading its answers anyway) and a warning says so once.
Notifications need no gate: the session handles each at once, and a
changed tool list is re-read one list at a time (``_session``).
"""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Callable, Set

import mcp_types as types

#: A server's own requests open at once; well above what a well-behaved server has in flight.
MAX_SERVER_REQUESTS = 32


class RequestGate:
    def __init__(self, limit: int, warn: Callable[[str], None]) -> None:
        self.limit, self._warn = limit, warn
        self.open: Set[Any] = set()
        self.dropped = 0

    def admit(self, item: Any) -> bool:
        """Whether an incoming item goes on to the session (False: a request past the limit)."""
        message = getattr(item, "message", None)
        if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            self.open.discard(str((message.params or {}).get("requestId")))
        if not isinstance(message, types.JSONRPCRequest):
            return True
        if len(self.open) >= self.limit:
            self.dropped += 1
            if self.dropped == 1:
                self._warn(f"it has {self.limit} requests to this client open and sends more without reading "
                           "the answers; further requests are dropped unanswered")
            return False
        self.open.add(str(message.id))
        return True

    def answered(self, item: Any) -> None:
        message = getattr(item, "message", None)
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self.open.discard(str(message.id))


class _Receive:
    """The transport's read stream, minus requests past the gate (the interface the SDK's dispatcher uses)."""

    def __init__(self, inner: Any, gate: RequestGate) -> None:
        self._inner, self._gate = inner, gate

    @property
    def last_context(self) -> Any:  # the sender's contextvars, where the transport keeps them
        return getattr(self._inner, "last_context", None)

    async def __aenter__(self) -> _Receive:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    def __aiter__(self) -> _Receive:
        return self

    async def __anext__(self) -> Any:
        while True:
            item = await self._inner.__anext__()
            if self._gate.admit(item):
                return item

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Send:
    def __init__(self, inner: Any, gate: RequestGate) -> None:
        self._inner, self._gate = inner, gate

    async def __aenter__(self) -> _Send:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    async def send(self, item: Any) -> None:
        await self._inner.send(item)
        self._gate.answered(item)

    async def aclose(self) -> None:
        await self._inner.aclose()


@contextlib.asynccontextmanager
async def gated(transport: Any, warn: Callable[[str], None], limit: int = MAX_SERVER_REQUESTS) -> AsyncIterator[Any]:
    """``transport``'s (read, write) streams with the server's open requests bounded."""
    async with transport as (read, write):
        gate = RequestGate(limit, warn)
        yield _Receive(read, gate), _Send(write, gate)
