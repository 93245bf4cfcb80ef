"""Checkpoints at round boundaries, and runs resumed from them (over real HTTP to a FakeProvider).

A resumed run must give what an uninterrupted run gives: the same request to
the model for the round that was interrupted, the same answer, rounds, tool
results, usage and counters; and a side-effect call the interrupted round had
started is never run again.
"""
from __future__ import annotations

import json
from typing import List

import pytest

from streamengine import (
    Checkpoint,
    ConfigError,
    DoneEvent,
    EngineConfig,
    InterruptedCall,
    Message,
    OpenAICompatibleClient,
    ProviderItem,
    ResetEvent,
    RoundEvent,
    StreamingEngine,
    ToolResult,
    ToolResultEvent,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ASK = [{"role": "user", "content": "what is x?"}]


@tool
def lookup(q: str) -> str:
    """Looks up."""
    return f"{q} is 42"


def sender():
    sent: List[str] = []

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends."""
        sent.append(to)
        return f"sent to {to}"

    return send, sent


def engine(fp, tools, **config):
    config.setdefault("models", ["m"])
    config.setdefault("tool_mode", "native")
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config),
                           approve=lambda call: True)


def call_turn(fp, call_id, name, args, usage=(10, 2)):
    fp.add_turn(s.text("let me look. "), s.tool_call(0, id=call_id, name=name, arguments=json.dumps(args)),
                s.usage(*usage), s.finish("tool_calls"))


def answer_turn(fp, text="x is 42.", usage=(20, 5)):
    fp.add_turn(s.text(text), s.usage(*usage), s.finish("stop"))


def run_all(eng, messages, **kwargs):
    events = list(eng.run(messages, **kwargs))
    assert isinstance(events[-1], DoneEvent)
    return events, events[-1].result


def test_a_run_hands_a_checkpoint_before_its_first_round_and_after_each_round_with_tools():
    saved: List[Checkpoint] = []
    with FakeProvider() as fp, engine(fp, [lookup]) as eng:
        call_turn(fp, "c1", "lookup", {"q": "x"})
        answer_turn(fp)
        _, result = run_all(eng, ASK, on_checkpoint=saved.append)
    assert [cp.round for cp in saved] == [0, 1]
    start, after = saved
    assert [m.content for m in start.messages] == ["what is x?"] and start.tool_results == ()
    assert after.rounds == ("let me look. ",) and after.usage is not None and after.usage.prompt_tokens == 10
    assert [r.text for r in after.tool_results] == ["x is 42"]
    assert {result.call_id: result for result in after.tool_results}["c1"].ok and after.telemetry.tools_started == 1
    assert after.messages[-2].tool_calls[0].name == "lookup" and after.messages[-1].role == "tool"
    assert result.answer == "x is 42."


def test_a_resumed_run_sends_the_same_request_and_gives_the_result_of_an_uninterrupted_one():
    saved: List[Checkpoint] = []
    with FakeProvider() as fp, engine(fp, [lookup]) as eng:
        call_turn(fp, "c1", "lookup", {"q": "x"})
        answer_turn(fp)
        _, whole = run_all(eng, ASK, on_checkpoint=saved.append)
        round_two = fp.requests[1].json["messages"]
    text = saved[1].to_json()
    with FakeProvider() as fp, engine(fp, [lookup]) as other:  # another engine, as on another worker
        answer_turn(fp)
        again: List[Checkpoint] = []
        events, resumed = run_all(other, Checkpoint.from_json(text), on_checkpoint=again.append)
        assert fp.requests[0].json["messages"] == round_two
    assert events[0] == ResetEvent(2, "the run was taken over after round 1; round 2 is asked again")
    assert not any(isinstance(e, RoundEvent) for e in events)  # round 2 goes on, announced by its reset
    assert not any(isinstance(e, ToolResultEvent) for e in events)  # round 1's tool is not run again
    assert again == []  # round 2 had no tools: no boundary after it
    assert (resumed.answer, resumed.rounds, resumed.tool_results) == (whole.answer, whole.rounds, whole.tool_results)
    assert resumed.usage == whole.usage
    same = ("rounds", "tools_started", "tools_ok", "finish_reasons", "model_used", "stop_reason")
    assert {k: getattr(resumed.telemetry, k) for k in same} == {k: getattr(whole.telemetry, k) for k in same}
    assert resumed.telemetry.total_s >= saved[1].elapsed_s


def test_a_checkpoint_survives_json_with_provider_items_and_tool_calls():
    message = Message(role="assistant", content="hm", provider_items=(ProviderItem("anthropic", {"type": "thinking",
                      "thinking": "t", "signature": "sig"}),))
    checkpoint = Checkpoint(round=1, messages=(Message(role="user", content="hi"), message),
                            tool_results=(ToolResult("c1", "lookup", True, "ok", duration_s=0.5),),
                            started=(("lookup", '{"q":"x"}'),), call_ids=("c1",), tools_total=1, scope="s1",
                            interrupted=(InterruptedCall("send", '{"to":"bob"}', None),))
    back = Checkpoint.from_json(checkpoint.to_json())
    assert back == checkpoint
    assert back.to_json() == checkpoint.to_json()


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", "expected a JSON object"),
    ('{"version": 99}', "version 99"),
    ("not json", "JSONDecodeError"),
    ('{"version": 1, "round": 1, "messages": [], "telemetry": {}}', "no messages"),
    ('{"version": 1, "round": -1, "messages": [], "telemetry": {}}', "round must be a count"),
])
def test_a_text_that_is_not_a_checkpoint_is_refused_saying_why(text, says):
    with pytest.raises(ConfigError) as caught:
        Checkpoint.from_json(text)
    assert says in str(caught.value) and "start the run again from its messages" in str(caught.value)
    assert caught.value.__cause__ is not None


def two_round_checkpoint(fp, tools) -> Checkpoint:
    """Round 1 looked x up; the checkpoint after it, as JSON and back."""
    saved: List[Checkpoint] = []
    with engine(fp, tools) as eng:
        call_turn(fp, "c1", "lookup", {"q": "x"})
        fp.add_turn(s.delay(0.01), s.finish("stop"))  # the run goes on; only its checkpoint matters here
        run_all(eng, ASK, on_checkpoint=saved.append)
    return Checkpoint.from_json(saved[1].to_json())


def test_a_side_effect_call_the_interrupted_round_started_is_not_run_again():
    send, sent = sender()
    with FakeProvider() as fp:
        checkpoint = two_round_checkpoint(fp, [lookup, send])
        call_turn(fp, "c2", "send", {"to": "bob"})
        answer_turn(fp, "could not confirm.")
        resumed = checkpoint.after_interruption([InterruptedCall("send", '{ "to" : "bob" }', None)])
        with engine(fp, [lookup, send]) as eng:
            events, result = run_all(eng, resumed)
    assert sent == []
    told = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [(e.result.name, e.skipped) for e in told] == [("send", "interrupted")]
    assert "may have taken effect" in (told[0].result.error or "")
    assert result.answer == "could not confirm." and result.telemetry.rounds == 3


def test_a_side_effect_call_with_a_logged_result_gets_that_result_and_read_only_calls_run_again():
    send, sent = sender()
    with FakeProvider() as fp:
        checkpoint = two_round_checkpoint(fp, [lookup, send])
        fp.add_turn(s.tool_call(0, id="c2", name="send", arguments='{"to":"bob"}'),
                    s.tool_call(1, id="c3", name="lookup", arguments='{"q":"y"}'), s.finish("tool_calls"))
        answer_turn(fp, "sent.")
        logged = ToolResult("old_id", "send", True, "sent to bob", duration_s=0.2)
        resumed = checkpoint.after_interruption([InterruptedCall("send", '{"to":"bob"}', logged),
                                                 InterruptedCall("lookup", '{"q":"y"}', None)])
        with engine(fp, [lookup, send]) as eng:
            events, result = run_all(eng, resumed)
    assert sent == []
    told = {e.result.name: e for e in events if isinstance(e, ToolResultEvent)}
    assert told["send"].skipped is None and told["send"].result.text == "sent to bob"
    assert told["send"].result.call_id == "c2"  # answered under the resumed call's id
    assert told["lookup"].result.text == "y is 42"  # read-only: ran again
    assert result.telemetry.tools_started == 3 and result.telemetry.tools_ok == 3


def test_a_resumed_run_counts_its_limits_on_from_the_checkpoint():
    with FakeProvider() as fp:
        checkpoint = two_round_checkpoint(fp, [lookup])
        fp.add_turn(s.tool_call(0, id="c9", name="lookup", arguments='{"q":"x"}'), s.finish("tool_calls"))
        with engine(fp, [lookup], max_continuations=1) as eng:
            events, result = run_all(eng, checkpoint)
    told = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [e.skipped for e in told] == ["duplicate"]  # round 1 ran it before the checkpoint
    assert result.telemetry.stop_reason == "max_continuations_reached" and result.telemetry.rounds == 2


def test_a_run_resumed_from_its_start_asks_round_one_again():
    saved: List[Checkpoint] = []
    with FakeProvider() as fp, engine(fp, [lookup]) as eng:
        answer_turn(fp, "first.")
        run_all(eng, ASK, on_checkpoint=saved.append)
        answer_turn(fp, "again.")
        events, result = run_all(eng, Checkpoint.from_json(saved[0].to_json()))
        assert fp.requests[1].json["messages"] == fp.requests[0].json["messages"]
    assert isinstance(events[0], ResetEvent) and events[0].round == 1
    assert result.answer == "again." and result.rounds == ("again.",)


def test_a_failing_checkpoint_hook_is_logged_and_the_run_goes_on():
    def broken(_: Checkpoint) -> None:
        raise RuntimeError("disk full")

    with FakeProvider() as fp, engine(fp, [lookup]) as eng:
        call_turn(fp, "c1", "lookup", {"q": "x"})
        answer_turn(fp)
        _, result = run_all(eng, ASK, on_checkpoint=broken)
    assert result.answer == "x is 42."


def test_on_checkpoint_must_be_callable():
    with FakeProvider() as fp, engine(fp, [lookup]) as eng, \
            pytest.raises(ConfigError, match="on_checkpoint must be a callable"):
            eng.run(ASK, on_checkpoint="save")  # type: ignore[arg-type]


def test_a_call_the_interrupted_round_refused_is_told_refused_again_not_run_and_not_counted_as_started():
    send, sent = sender()
    with FakeProvider() as fp:
        checkpoint = two_round_checkpoint(fp, [lookup, send])
        call_turn(fp, "c2", "send", {"to": "bob"})
        answer_turn(fp, "not sent.")
        refused = ToolResult("c1", "send", False, "", error="not approved")
        resumed = checkpoint.after_interruption([InterruptedCall("send", '{"to":"bob"}', refused, "c1",
                                                                 "not_approved")])
        resumed = Checkpoint.from_json(resumed.to_json())  # the call's id and skip reason travel too
        with engine(fp, [lookup, send]) as eng:
            events, result = run_all(eng, resumed)
    assert sent == []
    told = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [(e.result.call_id, e.skipped) for e in told] == [("c2", "not_approved")]
    assert result.telemetry.tools_started == 1  # round 1's lookup only


def test_a_resumed_round_never_hands_out_an_id_the_dead_worker_used():
    saved: List[Checkpoint] = []
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"), s.finish("stop"))
        with engine(fp, [lookup], tool_mode="inline") as eng:
            run_all(eng, ASK, on_checkpoint=saved.append)
        fp.add_turn(s.text('<tool name="lookup">{"q": "y"}</tool>'), s.finish("stop"))
        answer_turn(fp, "y is 42.")
        started = saved[0].after_interruption([InterruptedCall("lookup", '{"q":"z"}', None, "call_inline_r1_1")])
        with engine(fp, [lookup], tool_mode="inline") as eng:
            events, _ = run_all(eng, started)
    told = [e for e in events if isinstance(e, ToolResultEvent)]
    assert told and told[0].result.call_id != "call_inline_r1_1" and told[0].result.text == "y is 42"


def test_a_checkpoint_keeps_the_inline_scanners_parse_errors_of_its_rounds():
    saved: List[Checkpoint] = []
    with FakeProvider() as fp, engine(fp, [lookup], tool_mode="inline") as eng:
        fp.add_turn(s.text('<tool name="lookup">{not json</tool> <tool name="lookup">{"q": "x"}</tool>'),
                    s.finish("stop"))
        answer_turn(fp)
        _, result = run_all(eng, ASK, on_checkpoint=saved.append)
    assert result.telemetry.parse_errors == 1
    assert saved[-1].round == 1 and saved[-1].telemetry.parse_errors == 1


def test_a_checkpoint_past_this_engines_last_round_is_refused_before_any_request():
    with FakeProvider() as fp:
        checkpoint = two_round_checkpoint(fp, [lookup])  # after round 1
        with engine(fp, [lookup], max_continuations=0) as eng, \
                pytest.raises(ConfigError, match="max_continuations=0"):  # this engine stops after round 1
            eng.run(checkpoint)
        assert fp.request_count == 2  # the two of the run that made the checkpoint, none since


def test_an_interrupted_side_effect_call_is_known_again_when_the_model_writes_its_numbers_another_way():
    sent: List[int] = []

    @tool(side_effects=True)
    def pay(cents: float) -> str:
        """Pays."""
        sent.append(int(cents))
        return "paid"

    with FakeProvider() as fp:
        checkpoint = two_round_checkpoint(fp, [lookup, pay])
        fp.add_turn(s.tool_call(0, id="c2", name="pay", arguments='{"cents": 500.0}'), s.finish("tool_calls"))
        answer_turn(fp, "could not confirm.")
        resumed = checkpoint.after_interruption([InterruptedCall("pay", '{"cents": 500}', None, "c1")])
        with engine(fp, [lookup, pay]) as eng:
            events, _ = run_all(eng, resumed)
    assert sent == []
    assert [e.skipped for e in events if isinstance(e, ToolResultEvent)] == ["interrupted"]
