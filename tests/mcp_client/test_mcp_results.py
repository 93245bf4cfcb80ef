"""What the model reads of an MCP CallToolResult: text, structured content, media, resources, errors.

The lab server's ``contents`` tool answers each shape as built (tests/support/mcp_servers/lab.py); the
tool is called through ``McpServer`` as an engine calls it.
"""
from __future__ import annotations

import json
import sys

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from mcp_servers.support import lab_http, no_mcp_leak, record  # noqa: F401 - fixtures

from streamengine import ToolCall
from streamengine.mcp import McpServer
from streamengine.tools import ToolExecutor

pytestmark = pytest.mark.usefixtures("no_mcp_leak")


@pytest.fixture
def contents(lab_http):
    """``contents(kind)``: the lab tool's result as the model reads it (a ToolResult)."""
    with McpServer.http(lab_http.url) as lab, ToolExecutor() as executor:
        tool = next(t for t in lab.tools(eager=True) if t.name == "contents")

        def call(kind):
            return executor.submit(tool, ToolCall("c1", "contents", json.dumps({"kind": kind})), timeout=20).result()

        yield call


def test_text_blocks_are_joined_and_structured_content_is_json_when_there_is_no_text(contents):
    assert contents("texts").text == "one\ntwo"
    assert contents("structured").text == '{"a": 1, "b": "é"}'
    assert contents("text-and-structured").text == "one"


def test_media_and_resources_become_a_line_naming_them(contents):
    result = contents("media")
    assert result.ok, result.error
    assert "image returned: image/png" in result.text and "aGVsbG8" not in result.text
    assert "file:///tmp/report.pdf" in result.text and "memo://1" in result.text and "memo text" in result.text
    assert "blob://2" in result.text and "binary" in result.text


def test_is_error_gives_the_servers_text_as_the_error(contents):
    failed = contents("error")
    assert not failed.ok and "tool 'contents' failed: no such customer" in failed.error
    silent = contents("silent-error")
    assert not silent.ok and "gave no reason" in silent.error
