"""An MCP server's ``rag_search`` never silently replaces the engine's scoped search.

A real MCP server over stdio (the SDK's server in a child process) offers a
tool named ``rag_search``: with ``rag=`` given, that clash is refused at
construction like any other name clash, naming the server and the way out;
the application's own Python ``rag_search`` still wins, as documented.
"""
from __future__ import annotations

import sys

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from mcp_servers.support import no_mcp_leak  # noqa: F401 - fixture

from streamengine import ConfigError, EngineConfig, OpenAICompatibleClient, SqliteRagStore, StreamingEngine, tool
from streamengine.mcp import McpServer
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")

NOTES_SERVER = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def rag_search(query: str) -> str:
    """Searches the server's own notes."""
    return "from the notes server"


@server.tool()
def jot(text: str) -> str:
    """Writes a note."""
    return "jotted"


server.run()
'''


def notes_server() -> McpServer:
    return McpServer.stdio(sys.executable, "-c", NOTES_SERVER, name="notes")


def engine(fp, tools, rag):
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(models=["m"]), rag=rag)


def test_an_mcp_tool_named_rag_search_with_a_store_is_refused_naming_the_server_and_the_way_out():
    with notes_server() as notes, FakeProvider() as fp, SqliteRagStore() as store:
        with pytest.raises(ConfigError) as raised:
            engine(fp, notes.tools(), store)
        message = str(raised.value)
        assert "'rag_search'" in message and "'notes'" in message
        assert "prefix=" in message and "include=" in message
        # Renamed by a prefix, or left out, it is no clash: the engine's own search is the one the model gets.
        with engine(fp, notes.tools(prefix="notes_"), store) as renamed:
            assert renamed.registry.get("notes_rag_search") is not None
            assert renamed.registry.get("rag_search").description != "Searches the server's own notes."
        with engine(fp, notes.tools(include={"jot"}), store) as without:
            assert "jot" in without.registry.names


def test_an_mcp_tool_named_rag_search_without_a_store_is_just_a_tool():
    with notes_server() as notes, FakeProvider() as fp:
        fp.add_turn(s.tool_call(0, id="c1", name="rag_search", arguments='{"query": "x"}'), s.finish("tool_calls"))
        fp.add_turn(s.text("ok"))
        with engine(fp, notes.tools(eager=True), None) as plain:
            result = plain.complete([{"role": "user", "content": "q"}])
    assert result.tool_results[0].text == "from the notes server"


def test_the_applications_own_python_rag_search_still_wins_with_a_store():
    @tool
    def rag_search(query: str) -> str:
        """The application's own search."""
        return "from the application"

    with FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.tool_call(0, id="c1", name="rag_search", arguments='{"query": "x"}'), s.finish("tool_calls"))
        fp.add_turn(s.text("ok"))
        with engine(fp, [rag_search], store) as own:
            result = own.complete([{"role": "user", "content": "q"}])
    assert result.tool_results[0].text == "from the application"
