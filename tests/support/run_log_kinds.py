"""Making run logs of every kind for the contract tests, in this process or in another.

Redis comes from ``STREAMENGINE_TEST_REDIS_URL`` (scripts/_redis.sh), PostgreSQL
from ``STREAMENGINE_TEST_PG_DSN`` (scripts/_postgres.sh); ``scripts/test`` starts
both.  Without one, its tests skip with the reason, except under ``CI=true``,
where they fail: CI must never pass by skipping them.

Run as a script, this file is the other process of the cross-process tests:
``python run_log_kinds.py ACTION SPEC_JSON ARGS_JSON``.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List

import pytest

from streamengine.runs import Lease, MemoryRunLog, PostgresRunLog, RedisRunLog, RunLog, SqliteRunLog

KINDS = ["memory", "sqlite", "redis", "postgres"]
SHARED_KINDS = ["sqlite", "redis", "postgres"]  # several processes can open them
REDIS_URL_ENV = "STREAMENGINE_TEST_REDIS_URL"
PG_DSN_ENV = "STREAMENGINE_TEST_PG_DSN"
ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: tests/support/ is two down


def server_address(env: str, what: str, example: str) -> str:
    """The test server's address; skips (fails under CI=true) when there is none."""
    address = os.environ.get(env)
    if address:
        return address
    message = (f"no {what} for the run-log tests: ${env} is not set; run the tests through scripts/test "
               f"(it starts a throwaway server) or set {env}={example}")
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: these tests must run in CI)", pytrace=False)
    pytest.skip(message)


def open_log(spec: Dict[str, Any], **limits: Any) -> RunLog:
    """A log on the store ``spec`` names; every log opened from one spec sees the same runs."""
    kind = spec["kind"]
    if kind == "memory":
        return MemoryRunLog(**limits)
    if kind == "sqlite":
        return SqliteRunLog(spec["path"], **limits)
    if kind == "redis":
        return RedisRunLog(spec["url"], prefix=spec["prefix"], **limits)
    return PostgresRunLog(spec["dsn"], table=spec["table"], **limits)


class LogMaker:
    """Opens logs of one kind on one fresh namespace (file, key prefix or tables); removes it after."""

    def __init__(self, kind: str, tmp_path: pathlib.Path) -> None:
        self.kind = kind
        name = f"runs_{uuid.uuid4().hex[:12]}"
        self.spec: Dict[str, Any] = {"kind": kind}
        if kind == "sqlite":
            self.spec["path"] = str(tmp_path / f"{name}.sqlite")
        elif kind == "redis":
            self.spec.update(url=server_address(REDIS_URL_ENV, "Redis", "redis://127.0.0.1:6379/0"), prefix=f"{name}:")
        elif kind == "postgres":
            self.spec.update(dsn=server_address(PG_DSN_ENV, "PostgreSQL", "postgresql://user@host/db"), table=name)
        self.logs: List[RunLog] = []

    def new(self, **limits: Any) -> RunLog:
        log = open_log(self.spec, **limits)
        self.logs.append(log)
        return log

    def cleanup(self) -> None:
        for log in self.logs:
            log.close()
        if self.kind == "redis":
            import redis

            with redis.Redis.from_url(self.spec["url"]) as client:
                for key in client.scan_iter(match=f"{self.spec['prefix']}*"):
                    client.delete(key)
        elif self.kind == "postgres":
            import psycopg

            with psycopg.connect(self.spec["dsn"], autocommit=True) as conn:
                for suffix in ("_events", "_approvals", ""):
                    table = psycopg.sql.Identifier(self.spec["table"] + suffix)
                    conn.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {}").format(table))


@pytest.fixture(params=KINDS)
def logs(request: Any, tmp_path: pathlib.Path) -> Any:
    """A :class:`LogMaker` for each kind of log (import it into a test module)."""
    maker = LogMaker(request.param, tmp_path)
    yield maker
    maker.cleanup()


@pytest.fixture(params=SHARED_KINDS)
def shared_logs(request: Any, tmp_path: pathlib.Path) -> Any:
    """A :class:`LogMaker` for each kind several processes share."""
    maker = LogMaker(request.param, tmp_path)
    yield maker
    maker.cleanup()


def lease_json(lease: Lease) -> Dict[str, Any]:
    return {"run_id": lease.run_id, "token": lease.token, "lease_s": lease.lease_s, "retain_s": lease.retain_s}


def in_another_process(action: str, spec: Dict[str, Any], **args: Any) -> subprocess.Popen[str]:
    """This file as a script in a new Python process, doing ``action`` on the store ``spec``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, __file__, action, json.dumps(spec), json.dumps(args)],
                            stdout=subprocess.PIPE, text=True, env=env)


def _main(action: str, spec: Dict[str, Any], args: Dict[str, Any]) -> None:
    with open_log(spec) as log:
        print("ready", flush=True)
        time.sleep(args.get("delay_s", 0.0))
        if action == "append":
            print(log.append(Lease(**args["lease"]), [tuple(event) for event in args["events"]]), flush=True)
        elif action == "request_stop":
            log.request_stop(args["run_id"], args["owner"])
        elif action == "create_and_hang":  # a producer that the test kills with SIGKILL
            log.create(args["run_id"], args["owner"], lease_s=args["lease_s"])
            print("created", flush=True)
            time.sleep(60)


if __name__ == "__main__":
    _main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]))
