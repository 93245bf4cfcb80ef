"""MCP servers that misbehave on purpose (tests/support/mcp_servers/hostile.py): huge answers, notification floods,
odd tool lists, children that will not stop.  What they send is bounded by McpLimits, never by them."""
from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

if sys.version_info < (3, 10):
    pytest.skip("the MCP SDK needs Python 3.10+", allow_module_level=True)

from conftest import wait_for
from mcp_servers.support import hostile_http, hostile_stdio_args, lab_stdio_args, no_mcp_leak, process_gone, record  # noqa: F401 - fixtures

from streamengine import ConfigError, ToolCall
from streamengine.mcp import McpLimits, McpServer
from streamengine.tools import ToolExecutor

pytestmark = pytest.mark.usefixtures("no_thread_leak", "no_mcp_leak")
MiB = 1024 * 1024
CAP = 2 * MiB


@pytest.fixture
def log_lines():
    """What streamengine logs (DEBUG and up) during the test, as the lines a sink receives."""
    from loguru import logger

    from streamengine import enable_logging

    lines = []
    handler = enable_logging(level="DEBUG", sink=lambda message: lines.append(str(message)))
    yield lines
    logger.remove(handler)
    logger.disable("streamengine")


def call(executor, tool, args, timeout=60.0):
    return executor.submit(tool, ToolCall("c1", tool.name, json.dumps(args)), timeout=timeout).result()


def by_name(tools):
    return {t.name: t for t in tools}


class PeakMemory:
    """This process's peak resident memory since ``start()`` (Linux: VmHWM, reset through clear_refs)."""

    @staticmethod
    def _kib(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

    def start(self):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        self.base = self._kib("VmRSS")

    def growth_mib(self):
        return (self._kib("VmHWM") - self.base) / 1024


def hostile_over(transport, hostile_http, record, limits=None, *flags):
    if transport == "http":
        return McpServer.http(hostile_http.url, name="hostile", limits=limits)
    return McpServer.stdio(*hostile_stdio_args(record, *flags), name="hostile", limits=limits)


# --- answers past the cap ----------------------------------------------------------------

def test_the_default_cap_is_the_same_on_every_transport():
    assert McpLimits().max_result_bytes == 16 * MiB
    with pytest.raises(ConfigError, match="max_result_bytes"):
        McpLimits(max_result_bytes=0)
    with pytest.raises(ConfigError, match="McpLimits"):
        McpServer.http("http://127.0.0.1:1/mcp", limits={"max_result_bytes": 5})


@pytest.mark.parametrize("shape", ["http-json", "http-sse", "stdio"])
def test_an_answer_past_the_cap_is_an_error_result_and_memory_stays_bounded(shape, hostile_http, record):
    transport, _, kind = shape.partition("-")
    offered = 96 * MiB
    peak = PeakMemory()
    with hostile_over(transport, hostile_http, record, McpLimits(max_result_bytes=CAP)) as server, \
            ToolExecutor() as executor:
        tools = by_name(server.tools(eager=True))
        peak.start()
        big = call(executor, tools["huge"], {"size": offered, "sse": kind == "sse"})
        grew = peak.growth_mib()
        after = call(executor, tools["echo"], {"text": "still here"})  # the session survived
    assert not big.ok
    assert f"over {CAP} bytes (McpLimits.max_result_bytes)" in big.error and "'huge'" in big.error, big.error
    assert grew < 4 * CAP / MiB + 48, f"peak memory grew {grew:.0f} MiB for a {CAP // MiB} MiB cap"
    assert after.ok and after.text == "still here"
    if transport == "http":  # the client stopped reading: the server could not write the rest
        wrote = [e["bytes"] for e in record.events() if e["event"] == "wrote"]
        assert wrote and wrote[0] < offered // 2, wrote


def test_a_compressed_http_answer_is_refused_not_inflated(hostile_http):
    with McpServer.http(hostile_http.url, name="hostile", limits=McpLimits(max_result_bytes=CAP)) as server, \
            ToolExecutor() as executor:
        tools = by_name(server.tools(eager=True))
        bomb = call(executor, tools["bomb"], {})
        after = call(executor, tools["echo"], {"text": "still here"})
    assert not bomb.ok and "'gzip'-compressed answer though none was asked for" in bomb.error, bomb.error
    assert after.ok


def test_a_stdio_answer_past_the_cap_without_its_id_first_closes_the_connection_and_says_why(record):
    with McpServer.stdio(*hostile_stdio_args(record), name="hostile", limits=McpLimits(max_result_bytes=CAP)) \
            as server, ToolExecutor() as executor:
        big = call(executor, by_name(server.tools(eager=True))["huge"], {"size": 8 * MiB, "id_last": True})
    assert not big.ok
    assert "over 2097152 bytes (McpLimits.max_result_bytes)" in big.error and "connection was closed" in big.error


# --- a flood of list_changed ---------------------------------------------------------------

def _median_call_s(executor, tool, n=15):
    times = []
    for _ in range(n):
        began = time.monotonic()
        result = call(executor, tool, {"text": "a b"})
        assert result.ok, result.error
        times.append(time.monotonic() - began)
    return statistics.median(times)


def _tasks_on_the_mcp_loop():
    from mcp_servers.support import mcp_loop

    async def count():
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), mcp_loop()).result(10)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_list_changed_flood_keeps_one_refresh_in_flight_and_another_server_fast(transport, hostile_http,
                                                                                   record, tmp_path):
    from mcp_servers.support import Record

    other_record = Record(tmp_path / "other.jsonl")
    with McpServer.stdio(*lab_stdio_args(other_record), name="other") as other, \
            hostile_over(transport, hostile_http, record) as hostile, ToolExecutor() as executor:
        measure = by_name(other.tools(eager=True))["measure"]
        baseline = _median_call_s(executor, measure)
        tasks_before = _tasks_on_the_mcp_loop()
        assert call(executor, by_name(hostile.tools(eager=True))["flood"], {"seconds": 6}).ok
        time.sleep(1.0)  # well into the flood
        tasks_during = _tasks_on_the_mcp_loop()
        during = _median_call_s(executor, measure)
    lists = [e for e in record.events() if e["event"] == "list"]
    assert len(lists) >= 2, "the flood should have caused a refresh at all"
    assert max(e["waiting"] for e in lists) == 1, "more than one tools/list was in flight at once"
    assert tasks_during < tasks_before + 50, (tasks_before, tasks_during)
    assert during < 20 * baseline + 0.25, (baseline, during)  # a failure guard; the flood had made it 600x


def test_a_server_that_floods_requests_and_reads_no_answers_holds_a_bounded_part_of_the_loop(record, log_lines):
    with McpServer.stdio(*hostile_stdio_args(record), name="deaf") as deaf, ToolExecutor() as executor:
        tasks_before = _tasks_on_the_mcp_loop()
        assert call(executor, by_name(deaf.tools(eager=True))["flood"], {"seconds": 6, "pings": True}).ok
        # The gate fills once the pipe to the deaf server is full: seconds on a loaded machine, so wait for it.
        assert wait_for(lambda: any("requests are dropped unanswered" in line for line in log_lines), timeout=5.5)
        time.sleep(0.5)
        tasks_during = _tasks_on_the_mcp_loop()
    assert tasks_during < tasks_before + 50, (tasks_before, tasks_during)  # it was 16,000 after 5 s
    assert sum("requests are dropped unanswered" in line for line in log_lines) == 1


# --- tool lists ----------------------------------------------------------------------------

def test_an_odd_tool_list_is_bounded_and_each_problem_is_told_once(record, log_lines):
    limits = McpLimits(max_tools=50, max_description_chars=500, max_schema_bytes=10_000)
    with McpServer.stdio(*hostile_stdio_args(record, "--listing", "odd"), name="odd", limits=limits) as odd:
        tools = by_name(odd.tools())
        listed = odd.list_tools()
        again = by_name(odd.tools())
    assert len(tools) == len(listed) == 50 and set(again) == set(tools)
    assert "bad name!" not in tools and "sprawling" not in tools and {"echo", "wordy"} <= set(tools)
    assert len(tools["wordy"].spec.description) <= 500 + len(" [...]")
    assert all(len(json.dumps(t)) < 20_000 for t in listed)
    text = "".join(log_lines)
    for said in ("'bad name!' left out", "'wordy' is 100000 characters", "'sprawling' left out",
                 "tools; only the first 50 are used (McpLimits.max_tools)"):
        assert text.count(said) == 1, (said, text)


def test_a_tool_name_listed_twice_is_an_error_not_the_last_one_wins(record):
    with McpServer.stdio(*hostile_stdio_args(record, "--listing", "duplicate"), name="twice") as twice, \
            pytest.raises(ConfigError, match=r"lists two tools named 'echo'"):
        twice.tools()


# --- closing children that will not stop ---------------------------------------------------

def test_close_ends_a_stdio_server_that_ignores_eof_and_sigterm(record):
    server = McpServer.stdio(*hostile_stdio_args(record, "--ignore-eof", "--ignore-term"), name="stubborn")
    server.start()
    pid = server._endpoint.state.pid
    began = time.monotonic()
    server.close()
    assert process_gone(pid)
    assert any(e["event"] == "term" for e in record.events())  # asked politely first
    assert time.monotonic() - began < 30  # a hang guard, not a speed claim


def test_close_all_stops_stubborn_servers_side_by_side(record):
    servers = [McpServer.stdio(*hostile_stdio_args(record, "--ignore-eof", "--ignore-term"), name=f"s{i}")
               for i in range(3)]
    for server in servers:
        server.start()
    pids = [server._endpoint.state.pid for server in servers]
    McpServer.close_all(servers)
    assert all(process_gone(pid) for pid in pids)
    terms = sorted(e["t"] for e in record.events() if e["event"] == "term")
    assert len(terms) == 3
    assert terms[-1] - terms[0] < 2.0  # each was asked before the first one's grace ran out: not one by one


def test_a_program_that_exits_without_closing_leaves_no_server_running(record, tmp_path):
    script = tmp_path / "forgetful.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from streamengine.mcp import McpServer
        server = McpServer.stdio(*{hostile_stdio_args(record, '--ignore-eof')!r})
        server.start()
        print(server._endpoint.state.pid, flush=True)
        sys.exit(0)  # what a SIGTERM handler that raises SystemExit does
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    assert process_gone(pid)
    assert "Event loop is closed" not in done.stderr and "Traceback" not in done.stderr, done.stderr


# --- credentials in the URL and the headers -------------------------------------------------

def test_a_token_in_the_url_and_credential_headers_never_reach_the_model_an_error_a_span_or_the_log(
        hostile_http, log_lines):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
    from streamengine.mcp import McpToolError
    from streamengine.testing import FakeProvider
    from streamengine.testing import steps as s

    exporter = InMemorySpanExporter()
    spans = TracerProvider()
    spans.add_span_processor(SimpleSpanProcessor(exporter))
    url = hostile_http.url + "?token=SECRETVALUE"
    headers = {"Authorization": "Bearer SECRETHEADER"}
    shown = []
    with McpServer.http(url, headers=headers) as server, FakeProvider() as fp, ToolExecutor() as executor:
        tools = server.tools(eager=True, include={"leak", "echo"})
        fp.add_turn(s.text('<tool name="leak">{}</tool>'))
        fp.add_turn(s.text("It failed."))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(models=["m"]),
                             tracer_provider=spans) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
        hostile_http.stop()
        down = call(executor, by_name(tools)["echo"], {"text": "anyone?"})
        shown += [json.dumps(fp.requests[1].json), result.tool_results[0].error, down.error, repr(server),
                  repr(tools[0])]
    with pytest.raises(McpToolError) as caught:
        McpServer.http(url, headers=headers, startup_timeout=5).start()
    shown += [str(caught.value), *log_lines]
    shown += [str(span.status.description) for span in exporter.get_finished_spans()]
    assert "denied: /mcp?token=***" in shown[0], shown[0]  # the model still reads what went wrong
    assert "127.0.0.1" in down.error and "127.0.0.1" in str(caught.value)
    leaks = [text for text in shown if "SECRETVALUE" in text or "SECRETHEADER" in text]
    assert leaks == []


def test_a_stdio_servers_credentials_in_its_arguments_env_and_stderr_are_masked():
    from streamengine.mcp import McpToolError

    script = ("import os, sys; print('token is', os.environ['API_TOKEN'], 'key is', sys.argv[2], file=sys.stderr, "
              "flush=True); sys.exit(3)")
    server = McpServer.stdio(sys.executable, "-c", script, "--api-key", "ARGSECRET99", name="leaky",
                             env={"API_TOKEN": "ENVSECRET99", "TZ": "Europe/Paris"}, startup_timeout=10)
    with pytest.raises(McpToolError) as caught:
        server.start()
    server.close()
    text = f"{caught.value} {server!r}"
    assert "token is *** key is ***" in text and "--api-key ***" in text, text
    assert "ARGSECRET99" not in text and "ENVSECRET99" not in text
