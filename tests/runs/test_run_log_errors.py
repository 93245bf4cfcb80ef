"""What a run log says when it cannot work: unreachable stores, misuse; never a password. And the doc's example."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re
import socket

import pytest
from run_log_kinds import REDIS_URL_ENV, server_address

from streamengine import ConfigError, StreamEngineError
from streamengine.runs import MemoryRunLog, PostgresRunLog, RedisRunLog, RunLogError, SqliteRunLog, new_run_id

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "runs.md"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_redis_is_named_without_its_password():
    with pytest.raises(RunLogError) as caught:
        RedisRunLog(f"redis://:hunter2secret@127.0.0.1:{_closed_port()}/0", timeout_s=1)
    message = str(caught.value)
    assert "could not reach the server" in message and "is the server up?" in message
    assert "hunter2secret" not in message and "127.0.0.1" in message
    assert isinstance(caught.value, StreamEngineError)


def test_an_unreachable_postgres_is_named_without_its_password():
    with pytest.raises(ConfigError) as caught:
        PostgresRunLog(f"postgresql://streamengine:hunter2secret@127.0.0.1:{_closed_port()}/x", timeout_s=1)
    message = str(caught.value)
    assert "cannot use the PostgreSQL run log" in message and "hunter2secret" not in message


def test_misuse_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="MemoryRunLog"):
        SqliteRunLog(":memory:")
    with pytest.raises(ConfigError, match="lease_s"):
        MemoryRunLog(lease_s=0)
    with pytest.raises(ConfigError, match="max_events"):
        MemoryRunLog(max_events=0)
    log = MemoryRunLog()
    run_id = new_run_id()
    log.create(run_id, "alice")
    with pytest.raises(ConfigError, match="at most 30 s per read"):
        log.read(run_id, "alice", timeout_s=60)
    with pytest.raises(ConfigError, match="Lease"):
        log.append("not a lease", [("token", "{}")])


def test_the_doc_example_runs_against_the_test_redis():
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    url = server_address(REDIS_URL_ENV, "Redis", "redis://127.0.0.1:6379/0")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace("redis://127.0.0.1:6379/0", url), {})
    lines = printed.getvalue().splitlines()
    assert len(lines) == 3 and "seq=1, name='token'" in lines[0] and "terminal=True" in lines[2]



