"""What the model reads of an MCP CallToolResult: text, structured content, media, resources, errors."""
from __future__ import annotations

import sys

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

import mcp_types as types

from streamengine.mcp import McpToolError
from streamengine.mcp._tools import result_text


def result(*content, structured=None, error=False):
    return types.CallToolResult(content=list(content), structured_content=structured, is_error=error)


def test_text_blocks_are_joined_and_structured_content_is_json_when_there_is_no_text():
    text = types.TextContent(text="one")
    assert result_text(result(text, types.TextContent(text="two")), "t") == "one\ntwo"
    assert result_text(result(structured={"a": 1, "b": "é"}), "t") == '{"a": 1, "b": "é"}'
    assert result_text(result(text, structured={"a": 1}), "t") == "one"


def test_media_and_resources_become_a_line_naming_them():
    image = types.ImageContent(data="aGVsbG8=", mime_type="image/png")
    link = types.ResourceLink(uri="file:///tmp/report.pdf", name="report")
    embedded = types.EmbeddedResource(resource=types.TextResourceContents(uri="memo://1", text="memo text",
                                                                          mime_type="text/plain"))
    blob = types.EmbeddedResource(resource=types.BlobResourceContents(uri="blob://2", blob="AAAA"))
    text = result_text(result(image, link, embedded, blob), "t")
    assert "image returned: image/png" in text and "aGVsbG8" not in text
    assert "file:///tmp/report.pdf" in text and "memo://1" in text and "memo text" in text
    assert "blob://2" in text and "binary" in text


def test_is_error_gives_the_servers_text_as_the_error():
    with pytest.raises(McpToolError, match="tool 'lookup' failed: no such customer"):
        result_text(result(types.TextContent(text="no such customer"), error=True), "lookup")
    with pytest.raises(McpToolError, match="gave no reason"):
        result_text(result(error=True), "lookup")
