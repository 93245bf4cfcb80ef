"""``StopReason``: one name per stop and finish reason, still equal to the strings it replaced.

Code written against the bare strings (``telemetry.stop_reason == "cancelled"``,
a JSON consumer, a browser reading SSE, the CLI's run log in SQLite) must not
see a difference: each member is checked through each of those.
"""
from __future__ import annotations

import json
import pickle
import sqlite3
from typing import Any, Dict, List

import pytest
import requests
from sse_spec_parser import parse
from wsgi_support import serving

from streamengine import (
    AnthropicClient,
    DoneEvent,
    EngineConfig,
    EngineResult,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    StopReason,
    StreamingEngine,
    Telemetry,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.web import STREAM_PATH, encode_stream, make_wsgi_app

#: Every reason the package reported as a bare string before the enum.
OLD_STRINGS = {
    "stop", "tool_calls", "length", "content_filter",  # a model round's finish reasons
    "cancelled", "llm_error", "llm_error_after_tokens", "max_continuations_reached", "output_limit",
    "internal_error",  # a run's stop reasons
}


def test_the_enum_holds_exactly_the_strings_it_replaced() -> None:
    assert {member.value for member in StopReason} == OLD_STRINGS


@pytest.mark.parametrize("member", list(StopReason), ids=str)
def test_a_member_behaves_like_its_string(member: StopReason) -> None:
    old = member.value
    assert member == old and old == member and hash(member) == hash(old)
    assert str(member) == old and f"{member}" == old and f"[{member:>30}]" == f"[{old:>30}]"
    assert "%s" % member == old and "{}".format(member) == old  # noqa: UP031, UP032 (logging's and loguru's forms)
    assert json.dumps({"reason": member}) == json.dumps({"reason": old})
    assert member in {old} and old in {member}
    assert pickle.loads(pickle.dumps(member)) is member
    assert StopReason(old) is member and StopReason.known(old) is member


def test_a_reason_the_package_does_not_know_passes_through_as_the_providers_string() -> None:
    assert StopReason.known("pause_turn") == "pause_turn"
    assert StopReason.known(None) is None and StopReason.known("") == ""


@pytest.mark.parametrize("member", list(StopReason), ids=str)
def test_a_member_reaches_sse_and_sqlite_as_its_plain_string(member: StopReason) -> None:
    telemetry = Telemetry(stop_reason=member, finish_reasons=[member, None])
    result = EngineResult(answer="a", rounds=("a",), tool_results=(), telemetry=telemetry)
    done = next(event for event in parse(b"".join(encode_stream([DoneEvent(result)]))).events
                if event.type == "done")
    sent = json.loads(done.data)["telemetry"]
    assert sent["stop_reason"] == member.value and type(sent["stop_reason"]) is str
    assert sent["finish_reasons"] == [member.value, None]

    with sqlite3.connect(":memory:") as db:
        db.execute("CREATE TABLE runs (stop_reason TEXT)")
        db.execute("INSERT INTO runs VALUES (?)", (member,))
        assert db.execute("SELECT stop_reason, typeof(stop_reason) FROM runs").fetchall() == [(member.value, "text")]


CLIENTS: Dict[str, Any] = {"openai": OpenAICompatibleClient, "anthropic": AnthropicClient,
                           "responses": OpenAIResponsesClient}


@pytest.mark.parametrize("wire", sorted(CLIENTS))
@pytest.mark.parametrize("finish", [StopReason.LENGTH, StopReason.CONTENT_FILTER])
def test_each_wire_reports_a_cut_off_as_the_member_and_sse_sends_its_string(wire: str, finish: StopReason) -> None:
    """Each wire's own word (``max_tokens``, ``incomplete``...) arrives as the member, over real HTTP both ways."""
    with FakeProvider(wire=wire) as fp:
        fp.add_turn(s.text("half an ans"), s.finish(finish.value))
        fp.add_turn(s.text("half an ans"), s.finish(finish.value))
        with CLIENTS[wire](fp.base_url, api_key="sk-test") as client, \
                StreamingEngine(client, (), EngineConfig(models=["m1"], idle_timeout=5.0)) as engine:
            result = engine.complete([{"role": "user", "content": "hi"}])
            assert result.finish_reasons == (finish,) and result.finish_reasons[0] is finish
            assert result.cut_off is finish
            with serving(make_wsgi_app(engine)) as url:
                reply = requests.post(url + STREAM_PATH, json={"messages": [{"role": "user", "content": "hi"}]},
                                      timeout=10)
    done: List[Any] = [event for event in parse(reply.content).events if event.type == "done"]
    assert json.loads(done[0].data)["telemetry"]["finish_reasons"] == [finish.value]
