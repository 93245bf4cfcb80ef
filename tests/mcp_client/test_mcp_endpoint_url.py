"""An MCP endpoint's URL is shown with only its credentials masked, so the user still reads which URL it was.

Over a real streamable-HTTP MCP server on 127.0.0.1 (tests/mcp_servers/hostile.py).
"""
from __future__ import annotations

import json
import sys

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from mcp_servers.support import hostile_http, no_mcp_leak, record  # noqa: F401 - fixtures

from streamengine import ToolCall
from streamengine.mcp import McpServer
from streamengine.tools import ToolExecutor

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")

SECRETS = ("SECRETVALUE1", "SIGNATURE123", "PASSWORD4711")


def test_a_down_servers_error_names_its_url_with_only_the_credentials_masked(hostile_http):
    url = (f"{hostile_http.url}?workspace=engineering-team&Token={SECRETS[0]}&X-Amz-Signature={SECRETS[1]}"
           f"&region=eu-west-1&db_password={SECRETS[2]}")
    readable = "?workspace=engineering-team&Token=***&X-Amz-Signature=***&region=eu-west-1&db_password=***"
    with McpServer.http(url, name="team") as server, ToolExecutor() as executor:
        echo = {t.name: t for t in server.tools(eager=True)}["echo"]
        hostile_http.stop()
        down = executor.submit(echo, ToolCall("c1", "echo", json.dumps({"text": "hi"})), timeout=30).result()
        shown = [repr(server), down.error or ""]
    assert not down.ok
    assert all(readable in text for text in shown), shown
    assert not [text for text in shown if any(secret in text for secret in SECRETS)], shown


@pytest.mark.parametrize("url, shown", [
    ("https://h/mcp?api_key=K&mode=fast", "https://h/mcp?api_key=***&mode=fast"),
    ("https://h/mcp?AUTH=A&sig=S&session_id=X&page=2", "https://h/mcp?AUTH=***&sig=***&session_id=***&page=2"),
    ("https://u:p@h/mcp?client_secret=C&access%5Ftoken=T&q=", "https://***@h/mcp?client_secret=***&access%5Ftoken=***&q="),
])
def test_only_credential_named_parameters_are_masked(url, shown):
    server = McpServer.http(url, name="team")  # not started: nothing is sent anywhere
    try:
        assert repr(server) == f"McpServer(MCP server 'team' at {shown}, new)"
    finally:
        server.close()
