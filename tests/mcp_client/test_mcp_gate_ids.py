"""The gate on a server's own requests (``RequestGate`` in mcp/_session.py) counts what is really outstanding,
whatever ids the server chooses: a reused id or a cancel must not let a server that reads no answers grow the
shared loop.

This module imports the private ``streamengine.mcp._session`` on purpose: the gate is a private algorithm,
driven here directly with the SDK's own dispatcher (a cancel racing an answer cannot be timed from outside)
and held to its own bound.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from mcp_servers.support import hostile_stdio_args, no_mcp_leak, record  # noqa: F401 - fixtures

from streamengine import ToolCall
from streamengine.mcp import McpServer
from streamengine.mcp._session import MAX_SERVER_REQUESTS
from streamengine.tools import ToolExecutor

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")


@pytest.fixture
def log_lines():
    from loguru import logger

    from streamengine import enable_logging

    lines = []
    handler = enable_logging(level="DEBUG", sink=lambda message: lines.append(str(message)))
    yield lines
    logger.remove(handler)
    logger.disable("streamengine")


def _tasks_on_the_mcp_loop():
    from streamengine.mcp import _session

    async def count():
        return len(asyncio.all_tasks())

    return _session.run(count(), 10)


def _tasks_while_flooded(record, pings):
    """Tasks on the MCP loop before and 1.5 s into a deaf server's ping flood of the given kind."""
    with McpServer.stdio(*hostile_stdio_args(record), name="deaf") as deaf, ToolExecutor() as executor:
        flood = {t.name: t for t in deaf.tools(eager=True)}["flood"]
        before = _tasks_on_the_mcp_loop()
        args = json.dumps({"seconds": 2, "pings": pings})
        assert executor.submit(flood, ToolCall("c1", "flood", args), timeout=30).result().ok
        time.sleep(1.5)
        return before, _tasks_on_the_mcp_loop()


def test_pings_that_all_reuse_one_id_are_held_to_the_bound(record, log_lines):
    before, during = _tasks_while_flooded(record, "same")
    assert during < before + MAX_SERVER_REQUESTS + 18, (before, during)  # it grew by thousands
    assert sum("reuses request id 'p'" in line for line in log_lines) == 1, log_lines


def test_a_cancel_for_a_request_whose_answer_is_still_being_written_frees_nothing(record):
    """Whether a cancel lands before the answer is timing; the held tasks stay bounded either way."""
    before, during = _tasks_while_flooded(record, "cancelled")
    assert during < before + MAX_SERVER_REQUESTS + 18, (before, during)  # it grew by thousands


def test_a_request_the_sdk_settles_unanswered_after_a_cancel_frees_its_place():
    """Through the SDK's own dispatcher: a cancel that lands ends the request with no answer, and the gate hears
    of it (the ``on_request_unanswered`` hook), so a server that cancels what it asked keeps its places."""
    import anyio
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
    from mcp.shared.message import SessionMessage
    from mcp_types import JSONRPCNotification, JSONRPCRequest

    from streamengine.mcp._session import RequestGate, _Receive, _Send

    async def scenario():
        to_client, client_reads = anyio.create_memory_object_stream(16)
        client_writes, from_client = anyio.create_memory_object_stream(16)
        gate = RequestGate(1, lambda text: None)
        started = anyio.Event()

        async def on_request(ctx, method, params):
            if method == "slow":
                started.set()
                await anyio.sleep_forever()
            return {"method": method}

        async def on_notify(ctx, method, params):
            pass

        dispatcher = JSONRPCDispatcher(_Receive(client_reads, gate), _Send(client_writes, gate))
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run, on_request, on_notify)
            await to_client.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id="s", method="slow")))
            await started.wait()
            assert gate.open == {"s"}
            await to_client.send(SessionMessage(JSONRPCNotification(
                jsonrpc="2.0", method="notifications/cancelled", params={"requestId": "s"})))
            await to_client.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id="q", method="quick")))
            with anyio.fail_after(5):
                answer = await from_client.receive()
            await to_client.aclose()
        return answer.message, gate.open

    answer, still_open = anyio.run(scenario)
    assert (answer.id, answer.result) == ("q", {"method": "quick"}), answer  # "s" got none; "q" found a place
    assert still_open == set()
