"""streamengine.mcp against real MCP servers: the reference time and git servers over stdio, the lab one over HTTP."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from mcp_servers.support import (  # noqa: F401 - fixtures
    lab_http,
    lab_stdio_args,
    mcp_loop_threads,
    no_mcp_leak,
    process_gone,
    record,
    server_command,
)

from streamengine import ConfigError, ToolCall, ToolError
from streamengine.mcp import McpServer, McpToolError
from streamengine.tools import Tool, ToolExecutor, ToolRegistry

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")


def call(tool, args, timeout=20.0, executor=None):
    own = executor is None
    executor = executor or ToolExecutor()
    try:
        handle = executor.submit(tool, ToolCall("c1", tool.name, json.dumps(args)), timeout=timeout)
        return handle.result()
    finally:
        if own:
            executor.shutdown()


def by_name(tools):
    return {t.name: t for t in tools}


def lab_over(transport, lab_http, record):
    """The lab server over streamable HTTP (already running) or stdio (started by the McpServer).

    ``-legacy`` forces the initialize handshake (2025-11-25): cancellation is then a
    ``notifications/cancelled`` on HTTP too, and a changed tool list a plain notification.
    """
    kind, _, era = transport.partition("-")
    protocol = "legacy" if era == "legacy" else "auto"
    if kind == "http":
        return McpServer.http(lab_http.url, protocol=protocol)
    return McpServer.stdio(*lab_stdio_args(record), protocol=protocol)


# --- the reference servers ------------------------------------------------------------------

def test_time_server_tools_carry_the_servers_schema_unchanged_and_answer():
    with McpServer.stdio(server_command("mcp-server-time"), "--local-timezone", "UTC") as clock:
        listed = {t["name"]: t for t in clock.list_tools()}
        tools = by_name(clock.tools(trust_annotations=True))
        now = tools["get_current_time"]
        assert now.spec.parameters == listed["get_current_time"]["inputSchema"]
        assert now.spec.parameters["properties"]["timezone"]["title"] == "Timezone"  # titles and all
        assert now.spec.description == listed["get_current_time"]["description"]
        assert now.side_effects is False  # readOnlyHint: true
        result = call(now, {"timezone": "Europe/Paris"})
        assert result.ok, result.error
        assert json.loads(result.text)["timezone"] == "Europe/Paris"
        pid = clock._endpoint.state.pid
    assert process_gone(pid)


def test_time_server_validation_error_is_the_tools_error_result():
    with McpServer.stdio(server_command("mcp-server-time")) as clock:
        result = call(by_name(clock.tools())["get_current_time"], {"timezone": 3})
    assert not result.ok
    assert "get_current_time" in result.error and "valid string" in result.error


def test_git_server_on_a_temporary_repository(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("hello\n")
    with McpServer.stdio(server_command("mcp-server-git"), "--repository", str(repo)) as git:
        tools = by_name(git.tools(prefix="git.", trust_annotations=True))
        status = call(tools["git.git_status"], {"repo_path": str(repo)})
        assert status.ok and "notes.txt" in status.text
        assert tools["git.git_status"].side_effects is False
        assert tools["git.git_commit"].side_effects is True  # readOnlyHint: false
        assert tools["git.git_add"].remote_name == "git_add"


# --- the lab server over streamable HTTP ----------------------------------------------------

def test_by_default_no_tool_is_eager_whatever_the_server_annotates(lab_http):
    with McpServer.http(lab_http.url, name="lab") as lab:
        default = by_name(lab.tools())
    assert default["slow"].annotations == {"readOnlyHint": True}
    assert all(t.side_effects for t in default.values())
    assert {t.side_effects_reason for t in default.values()} == {
        "server annotations not trusted (trust_annotations=False)"}
    assert not any(t.annotations_trusted for t in default.values())


def test_trusted_annotations_decide_what_runs_eagerly_and_eager_overrides(lab_http):
    with McpServer.http(lab_http.url, name="lab") as lab:
        trusted = by_name(lab.tools(trust_annotations=True))
        assert trusted["slow"].side_effects is False and trusted["plain"].side_effects is True
        assert trusted["slow"].side_effects_reason == "server annotations trusted: readOnlyHint: true"
        assert trusted["plain"].side_effects_reason == "server annotations trusted: not marked readOnlyHint: true"
        assert all(not t.side_effects for t in lab.tools(eager=True))
        chosen = by_name(lab.tools(prefix="lab_", eager={"lab_plain"}, include={"lab_plain", "lab_slow", "lab_grow"}))
        assert sorted(chosen) == ["lab_grow", "lab_plain", "lab_slow"]
        assert chosen["lab_plain"].side_effects is False
        assert chosen["lab_plain"].side_effects_reason == "named in eager="
        # Naming one tool makes that one eager, not the server: an unannotated tool outside the set still waits,
        # and so does a read-only one while annotations are not trusted.
        assert chosen["lab_grow"].side_effects is True and chosen["lab_slow"].side_effects is True
        with pytest.raises(ConfigError, match="trust_annotations"):
            lab.tools(trust_annotations="yes")
        with pytest.raises(ConfigError, match="lab_nope"):
            lab.tools(prefix="lab_", include={"lab_nope"})
        with pytest.raises(ConfigError, match="after prefix"):
            lab.tools(prefix="lab_", eager={"plain"})


def test_the_same_name_from_two_servers_is_refused_with_a_hint_to_prefix(lab_http):
    with McpServer.http(lab_http.url, name="one") as one, McpServer.http(lab_http.url, name="two") as two:
        with pytest.raises(ToolError, match=r"prefix="):
            ToolRegistry([*one.tools(), *two.tools()])
        registry = ToolRegistry([*one.tools(), *two.tools(prefix="two_")])
        assert "slow" in registry and "two_slow" in registry


def test_results_text_structured_errors_and_images(lab_http):
    with McpServer.http(lab_http.url) as lab:
        tools = by_name(lab.tools(eager=True))
        assert call(tools["plain"], {"text": "abc"}).text == "ABC"
        assert json.loads(call(tools["measure"], {"text": "a b c"}).text) == {"chars": 5, "words": 3}
        failed = call(tools["boom"], {"reason": "disk full"})
        assert not failed.ok and "boom: disk full" in failed.error
        picture = call(tools["picture"], {})
        assert picture.ok and "image/png" in picture.text and "iVBOR" not in picture.text
        bad = call(tools["plain"], {"text": 5})
        assert not bad.ok and "text" in bad.error


@pytest.mark.parametrize("transport", ["http", "stdio", "http-legacy", "stdio-legacy"])
def test_a_timeout_cancels_the_handler_on_the_server(transport, lab_http, record):
    server = lab_over(transport, lab_http, record)
    with server:
        slow = by_name(server.tools())["slow"]
        result = call(slow, {"seconds": 30, "tag": transport}, timeout=1.0)
        assert not result.ok and result.timed_out and "timed out after 1s" in result.error
        assert record.wait("cancelled", transport), record.events()
        assert not record.has("end", transport)
        again = call(slow, {"seconds": 0.05, "tag": "after"})  # the session survived the cancel
        assert again.ok, again.error


def test_three_calls_to_one_server_run_at_once_without_holding_workers(lab_http, record):
    with McpServer.http(lab_http.url) as lab, ToolExecutor(max_workers=1) as executor:
        slow = by_name(lab.tools())["slow"]
        handles = [executor.submit(slow, ToolCall(f"c{i}", "slow", json.dumps({"seconds": 2, "tag": f"t{i}"})),
                                   timeout=20) for i in range(3)]
        assert executor.threads_alive() == 0  # no pool worker waits on an MCP call
        results = [h.result() for h in handles]
    assert all(r.ok for r in results), [r.error for r in results]
    starts = [record.when("start", f"t{i}") for i in range(3)]
    ends = [record.when("end", f"t{i}") for i in range(3)]
    assert max(starts) < min(ends)  # all three were running on the server at once


def test_cancelling_a_call_cancels_the_servers_handler(lab_http, record):
    with McpServer.http(lab_http.url) as lab, ToolExecutor() as executor:
        slow = by_name(lab.tools())["slow"]
        handle = executor.submit(slow, ToolCall("c1", "slow", json.dumps({"seconds": 30, "tag": "x"})), timeout=60)
        assert record.wait("start", "x")
        handle.cancel()
        result = handle.result()
        assert not result.ok
        assert record.wait("cancelled", "x"), record.events()


# --- faults ---------------------------------------------------------------------------------

def test_a_crashing_stdio_server_gives_an_error_then_restarts_once(record):
    with McpServer.stdio(*lab_stdio_args(record), name="lab") as lab:
        tools = by_name(lab.tools())
        first_pid = lab._endpoint.state.pid
        crashed = call(tools["exit_now"], {"code": 3})
        assert not crashed.ok
        assert "'lab'" in crashed.error and "exit status 3" in crashed.error
        assert "exiting with status 3 on request" in crashed.error  # the last stderr lines
        assert process_gone(first_pid)
        assert call(tools["slow"], {"seconds": 0.01, "tag": "back"}).ok  # restarted
        assert lab._endpoint.state.pid != first_pid
        assert not call(tools["exit_now"], {"code": 4}).ok
        refused = call(tools["slow"], {"seconds": 0.01, "tag": "no"})
        assert not refused.ok and "restarted 1 time(s)" in refused.error
        assert not record.has("start", "no")


def test_a_server_that_never_answers_initialize_fails_within_startup_timeout():
    began = time.monotonic()
    server = McpServer.stdio(sys.executable, "-c", "import time, sys; print('warming up', file=sys.stderr, "
                             "flush=True); time.sleep(60)", name="mute", startup_timeout=0.5)
    with pytest.raises(McpToolError, match=r"'mute'.*did not answer initialize within 0.5s") as caught:
        server.start()
    assert "warming up" in str(caught.value)
    assert time.monotonic() - began < 15  # a hang guard, not a speed claim
    server.close()


def test_a_server_that_is_down_names_its_url():
    from mcp_servers.support import free_port

    url = f"http://127.0.0.1:{free_port()}/mcp"
    server = McpServer.http(url, startup_timeout=5)
    with pytest.raises(McpToolError, match=url.replace(".", r"\.")):
        server.start()
    server.close()


def test_an_http_server_that_goes_down_mid_call_gives_an_error_naming_the_url(lab_http, record):
    with McpServer.http(lab_http.url) as lab, ToolExecutor() as executor:
        slow = by_name(lab.tools())["slow"]
        handle = executor.submit(slow, ToolCall("c1", "slow", json.dumps({"seconds": 30, "tag": "up"})), timeout=30)
        assert record.wait("start", "up")
        lab_http.kill()
        in_flight = handle.result()
        later = call(slow, {"seconds": 0.01, "tag": "down"}, timeout=20)
    assert not in_flight.ok and not in_flight.timed_out and lab_http.url in in_flight.error, in_flight.error
    assert not later.ok and lab_http.url in later.error, later.error


def test_bad_construction_is_refused_with_what_to_do():
    with pytest.raises(ConfigError, match="http"):
        McpServer.http("127.0.0.1:8931")
    with pytest.raises(ConfigError, match="startup_timeout"):
        McpServer.stdio("mcp-server-time", startup_timeout=0)
    with pytest.raises(ConfigError, match="strings"):
        McpServer.stdio("mcp-server-time", 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'legacy'"):
        McpServer.http("http://127.0.0.1:1/mcp", protocol="2025-11-25")


def test_close_leaves_no_thread_and_no_process(record):
    servers = [McpServer.stdio(*lab_stdio_args(record)) for _ in range(2)]
    for server in servers:
        server.start()
    pids = [s._endpoint.state.pid for s in servers]
    servers[0].close()
    assert mcp_loop_threads()  # the loop serves the other server still
    servers[1].close()
    assert not mcp_loop_threads()  # the last close joined it
    assert all(process_gone(pid) for pid in pids)
    with pytest.raises(ConfigError, match="closed"):
        servers[0].tools()


def test_a_tool_the_server_does_not_know_is_an_error_result(lab_http):
    from streamengine.mcp import McpTool

    with McpServer.http(lab_http.url, name="lab") as lab:
        ghost = McpTool(lab, "no_such_tool", "ghost", "", {"type": "object"}, False, None)
        result = call(ghost, {})
    assert not result.ok and "no_such_tool" in result.error


@pytest.mark.parametrize("transport", ["http", "stdio", "http-legacy", "stdio-legacy"])
def test_the_tool_list_is_refreshed_when_the_server_says_it_changed(transport, lab_http, record):
    from conftest import wait_for

    server = lab_over(transport, lab_http, record)
    with server:
        assert "sprout" not in by_name(server.tools())
        assert call(by_name(server.tools(eager=True))["grow"], {"name": "sprout"}).ok
        assert wait_for(lambda: "sprout" in by_name(server.tools()), timeout=10), [t.name for t in server.tools()]
        sprout = by_name(server.tools(trust_annotations=True))["sprout"]
        assert sprout.side_effects is False and call(sprout, {}).text == "sprout was added at run time"


def test_closing_the_server_ends_calls_in_flight_with_an_error(lab_http, record):
    lab = McpServer.http(lab_http.url, name="lab")
    with ToolExecutor() as executor:
        slow = by_name(lab.tools(timeout=60))["slow"]
        assert slow.timeout == 60.0
        handle = executor.submit(slow, ToolCall("c1", "slow", json.dumps({"seconds": 30, "tag": "open"})))
        assert record.wait("start", "open")
        lab.close()
        result = handle.result()
    assert not result.ok and "closed during the call to 'slow'" in result.error
    assert record.wait("cancelled", "open")
    with pytest.raises(ToolError, match=r"McpServer\.tools"):
        Tool.from_function(slow, timeout=5)  # an MCP tool's options are set where it is made
