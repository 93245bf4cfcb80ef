"""The streamable-HTTP transport, with every answer bounded by ``McpLimits.max_result_bytes``.

The SDK reads a JSON response body whole (``response.aread()``): a server
answering ``tools/call`` with 600 MB took 3.5 GB.  A response hook (it sees
every response, through any proxy the environment sets, before its body is
read) wraps the body so that reading past the cap raises an
``httpx2.StreamError``, which the SDK turns into an error for that one
request; SSE bodies are bounded per event by the SDK's own
``max_sse_event_size``, set to the same cap.  Compressed answers are not
asked for (``Accept-Encoding: identity``) and refused if sent anyway, so the
cap counts the bytes that are decoded.
"""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Dict

import httpx2

from ._limits import too_large

_SSE = "text/event-stream"


class AnswerTooLarge(httpx2.StreamError):
    """A body past the cap (or compressed against our asking): the SDK fails the one request it answers."""


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, refusal: str = "") -> None:
        self._inner, self._limit, self._refusal = inner, limit, refusal

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._refusal:
            raise AnswerTooLarge(self._refusal)
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise AnswerTooLarge(too_large(self._limit))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _capping(limit: int) -> Any:
    async def hook(response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        refusal = "" if encoding in ("", "identity") else \
            f"the server sent a {encoding!r}-compressed answer though none was asked for; not read"
        if refusal or not response.headers.get("content-type", "").lower().startswith(_SSE):
            response.stream = _CappedBody(response.stream, limit, refusal)

    return hook


@contextlib.asynccontextmanager
async def http_transport(url: str, headers: Dict[str, str], limit: int) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's own defaults: a response stream may stay open for minutes; the engine's
    # per-tool timeout, not this read timeout, is what bounds a call.
    headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
    async with httpx2.AsyncClient(headers={**headers, "Accept-Encoding": "identity"},
                                  timeout=httpx2.Timeout(30.0, read=300.0),
                                  event_hooks={"response": [_capping(limit)]}) as http:
        async with streamable_http_client(url, http_client=http, max_sse_event_size=limit) as streams:
            yield streams
