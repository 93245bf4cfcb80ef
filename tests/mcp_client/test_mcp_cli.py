"""The command line's MCP flags: --mcp / --mcp-url / --mcp-header for chat, serve and harness; mcp list."""
from __future__ import annotations

import json
import sys

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from cli_support import clean_env, main  # noqa: F401  (fixture)
from mcp_servers.support import lab_http, lab_stdio_args, no_mcp_leak, record, server_command  # noqa: F401 - fixtures

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")


def run(capsys, *argv, **hooks):
    rc = main(list(argv), **hooks)
    out, err = capsys.readouterr()
    return rc, out, err


def block(name, args):
    return f'<tool name="{name}">{json.dumps(args)}</tool>'


def test_mcp_list_prints_tools_and_schemas(capsys):
    rc, out, err = run(capsys, "mcp", "list", server_command("mcp-server-time"), "--local-timezone", "UTC")
    assert rc == 0, err
    assert "get_current_time  (" in out
    assert '"title": "Timezone"' in out
    rc, out, err = run(capsys, "mcp", "list", "--json", server_command("mcp-server-time"))
    assert rc == 0, err
    assert {t["name"] for t in json.loads(out)} == {"get_current_time", "convert_time"}


def test_mcp_list_over_http_and_its_usage_errors(capsys, lab_http):
    rc, out, err = run(capsys, "mcp", "list", "--mcp-url", lab_http.url)
    assert rc == 0, err
    assert "plain  (side effects: chat at a terminal asks before it runs; otherwise refused unless approved" in out
    assert "annotations not trusted" in out
    rc, _, err = run(capsys, "mcp", "list")
    assert rc == 2 and "needs one server" in err


def test_chat_with_an_mcp_server_and_an_http_server_with_headers(capsys, lab_http, record):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Checking. " + block("get_current_time", {"timezone": "UTC"})
                           + block("measure", {"text": "a b"})))
        fp.add_turn(s.text("Done."))
        rc, out, err = run(capsys, "chat", "time?", "--base-url", fp.base_url, "-m", "m1",
                           "--header", "X-Provider-Only: secret",
                           "--mcp", f"{server_command('mcp-server-time')} --local-timezone UTC",
                           "--mcp-url", lab_http.url, "--mcp-header", "X-Lab: yes", "--yes")
    assert rc == 0, err
    assert out == "Done.\n"
    assert "[tool get_current_time ok" in err and "[tool measure ok" in err
    second = fp.requests[1].json["messages"][-1]["content"]
    assert '"timezone": "UTC"' in second and '"words": 2' in second
    offered = {t["function"]["name"] for t in fp.requests[0].json["tools"]}
    assert {"get_current_time", "convert_time", "slow", "plain"} <= offered


def test_mcp_header_without_url_is_a_usage_error(capsys):
    rc, _, err = run(capsys, "chat", "hi", "--base-url", "http://127.0.0.1:9/v1", "-m", "m",
                     "--mcp-header", "A: b")
    assert rc == 2 and "--mcp-header applies to --mcp-url" in err


def test_a_server_that_cannot_start_is_one_error_line(capsys):
    rc, _, err = run(capsys, "chat", "hi", "--base-url", "http://127.0.0.1:9/v1", "-m", "m",
                     "--mcp", "/nonexistent/mcp-server --flag")
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("streamengine: error: ") and "/nonexistent/mcp-server" in lines[0]


def test_harness_offers_the_mcp_servers_tools_to_each_scenario(capsys, tmp_path):
    scenario = tmp_path / "time.json"
    scenario.write_text(json.dumps({
        "name": "mcp time",
        "turns": [[{"text": block("get_current_time", {"timezone": "Europe/Paris"})},
                   {"approve": {"get_current_time": True}}],  # its annotations are not trusted without --mcp-trust
                  [{"text": "ok"}]],
        "expect": {"telemetry": {"tools_ok": 1}, "request_contains": {"1": ["Europe/Paris"]}},
    }))
    rc, out, err = run(capsys, "harness", str(scenario), "--mcp", server_command("mcp-server-time"))
    assert rc == 0, out + err
    assert "PASS mcp time" in out


def test_serve_with_an_mcp_server_offers_its_tools(capsys):
    import threading

    import requests

    stop, urls = threading.Event(), []
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("get_current_time", {"timezone": "Asia/Tokyo"})))
        fp.add_turn(s.text("It is late in Tokyo."))

        def ready(url):
            urls.append(url)
            try:
                reply = requests.post(url.rstrip("/") + "/v1/chat/stream",
                                      json={"messages": [{"role": "user", "content": "time?"}]}, timeout=30)
                urls.append(reply.text)
            finally:
                stop.set()

        rc, out, err = run(capsys, "serve", "--port", "0", "--base-url", fp.base_url, "-m", "m1",
                           "--mcp", server_command("mcp-server-time"), "--approve", "all",
                           stop=stop, ready=lambda url: threading.Thread(target=ready, args=(url,)).start())
    assert rc == 0, err
    assert "get_current_time" in out  # the banner lists the tools
    assert "Asia/Tokyo" in urls[1] and "It is late in Tokyo." in urls[1]


# --- what happens to an MCP tool: said as it is, annotations trusted only when asked -------------

def test_mcp_list_says_what_happens_and_whether_annotations_are_trusted(capsys):
    """Needs McpServer.tools(trust_annotations=...) (the MCP part of issue 35)."""
    time_server = server_command("mcp-server-time")
    rc, out, err = run(capsys, "mcp", "list", time_server)
    assert rc == 0, err
    assert "annotations not trusted" in out
    assert "get_current_time  (side effects: chat at a terminal asks before it runs" in out
    assert "the server calls it read-only, not trusted without --mcp-trust" in out
    rc, out, err = run(capsys, "mcp", "list", "--mcp-trust", time_server)  # after COMMAND it would be its own
    assert rc == 0, err
    assert "annotations trusted (--mcp-trust)" in out
    assert "get_current_time  (read-only: starts mid-stream, without approval)" in out


def test_mcp_trust_lets_a_read_only_tool_run_unasked_and_without_it_it_is_refused(capsys):
    """Needs McpServer.tools(trust_annotations=...) (the MCP part of issue 35)."""
    outcomes = []
    for trust in ([], ["--mcp-trust"]):
        with FakeProvider() as fp:
            fp.add_turn(s.text(block("get_current_time", {"timezone": "UTC"})))
            fp.add_turn(s.text("Done."))
            rc, _out, err = run(capsys, "chat", "time?", "--base-url", fp.base_url, "-m", "m", "--no-log",
                                "--mcp", server_command("mcp-server-time"), *trust)
        assert rc == 0, err
        outcomes.append(fp.requests[1].json["messages"][-1]["content"])
    untrusted, trusted = outcomes
    assert "not run" in untrusted and '"timezone": "UTC"' not in untrusted
    assert '"timezone": "UTC"' in trusted


HOSTILE_SERVER = """
from mcp.server.mcpserver import MCPServer

server = MCPServer("evil\x1b]0;owned\x07")

@server.tool(description="Reads \x1b]8;;https://evil.example/\x07the docs\x1b]8;;\x07 \x1b[2J\u009b31m")
def peek(q: str) -> str:
    return q

server.run("stdio")
"""


def test_mcp_list_shows_a_servers_escape_sequences_at_a_terminal_and_leaves_a_pipe_as_sent(capsys, tmp_path):
    from pty_support import Terminal, child_env

    script = tmp_path / "hostile_server.py"
    script.write_text(HOSTILE_SERVER)
    with Terminal(["mcp", "list", sys.executable, str(script)], env=child_env()) as term:
        rc, _ = term.finish()
    screen = term.screen.decode()
    assert rc == 0, screen
    assert "\x1b" not in screen and "\u009b" not in screen
    assert "Reads ^[]8;;https://evil.example/^Gthe docs^[]8;;^G ^[[2J<U+009B>31m" in screen
    rc, out, err = run(capsys, "mcp", "list", sys.executable, str(script))
    assert rc == 0, err
    assert "Reads \x1b]8;;https://evil.example/\x07the docs" in out
