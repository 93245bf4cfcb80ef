"""The per-token fast paths give what the general paths give, over real HTTP.

Each fast path skips work for the common case (a prose token with no ``<``,
a batch of one token, a cancel read as an attribute); these tests feed the
same bytes through both and fail if a fast path ever sends something else:
a frame split across reads, a possible block start split across tokens, a
warning token that must still be rewritten for the public.
"""
from __future__ import annotations

import json
import random
import threading

import pytest
from test_engine import block, make_engine
from wsgi_support import call, environ_for

from streamengine import DoneEvent, TokenEvent, ToolResultEvent
from streamengine._cancel import CancelToken, cancel_flag
from streamengine._inline import FeedResult, InlineToolScanner
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.web._frames import DONE_FRAME, OK_FRAME, encode_event
from streamengine.web._sse import PublicErrors, frames
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MESSAGES = [{"role": "user", "content": "question"}]
# Prose, a '<' that is no block, a block start split over three tokens, a real block, prose again.
PIECES = ["Hello", " world", ", 3 < 4", " and <", "to", "ol", ' name="x">', "{}</tool>", " see <b>", " end."]


def _general(pieces):
    """What ``feed`` (the general path, a FeedResult each time) makes visible, piece by piece."""
    scanner = InlineToolScanner(id_prefix="call_inline_r1_")
    out = [scanner.feed(piece).visible for piece in pieces] + [scanner.flush().visible]
    return [text for text in out if text]


def _tokens(events):
    return [e.text for e in events if isinstance(e, TokenEvent)]


def test_a_plain_scanner_shows_a_piece_without_a_bracket_whole_as_feed_would():
    """The round skips ``feed`` when ``plain`` and no "<": feed must then give exactly that text, nothing else."""
    rng = random.Random(7)
    alphabet = ["a", " ", "<", "t", "o", "l", ">", '"', "/", "n", "=", "{", "}"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        cuts = sorted(rng.sample(range(1, len(text)), min(4, len(text) - 1))) if len(text) > 1 else []
        scanner = InlineToolScanner()
        for piece in [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]:
            skippable = scanner.plain and "<" not in piece
            fed = scanner.feed(piece)
            if skippable:
                assert fed == FeedResult(piece)
            assert scanner.plain == (scanner.pending_chars == 0 and scanner._mode == 0)  # text mode, none held


def test_the_prose_fast_path_and_the_scanner_give_the_same_tokens_over_http():
    """Each piece is its own frame (one read each): prose goes out as it came, the block is run."""
    @tool
    def x() -> str:
        """A tool."""
        return "ran"

    with FakeProvider() as fp:
        fp.add_turn(*[s.text(piece) for piece in PIECES])
        fp.add_turn(s.text("after"))
        with make_engine(fp, [x]) as engine:
            events = list(engine.run(MESSAGES))
    tokens = _tokens(events)
    first_round = tokens[:tokens.index("after")]
    assert first_round == _general(PIECES)
    assert first_round[:3] == ["Hello", " world", ", 3 < 4"]  # prose: one token per piece, as sent
    assert isinstance(events[-1], DoneEvent) and events[-1].result.telemetry.tools_ok == 1


def test_a_frame_split_across_reads_and_frames_sharing_a_read_give_the_same_tokens():
    """The same frames, once split mid-frame over two reads, once two frames in one write."""
    def frame(text):
        return ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + "\n\n").encode()

    pieces = ["plain", " and <", "tool", " more", " prose"]
    wire = b"".join(frame(p) for p in pieces)
    cut = len(frame(pieces[0])) + 9  # inside the second frame
    runs = []
    for steps in ([s.raw(wire[:cut]), s.delay(0.05), s.raw(wire[cut:])],
                  [s.raw(frame(pieces[0]) + frame(pieces[1])), s.delay(0.05), s.raw(wire[len(frame(pieces[0]))
                                                                                       + len(frame(pieces[1])):])]):
        with FakeProvider() as fp:
            fp.add_turn(*steps, s.finish(), s.done(), auto_finish=False)
            with make_engine(fp, [_noop()]) as engine:
                runs.append("".join(_tokens(engine.run(MESSAGES))))
    assert runs == ["".join(_general(pieces))] * 2


def _noop():
    @tool
    def noop() -> str:
        """Does nothing."""
        return ""
    return noop


def test_the_one_token_batch_fast_path_frames_exactly_what_encode_event_frames():
    texts = ["plain", "with \"quotes\" and \n newline", "\u2028 and \U0001F600", ""]
    batches = [[TokenEvent(t)] for t in texts] + [[TokenEvent("a"), TokenEvent("b")]]
    expected = OK_FRAME + b"".join(encode_event(e) for batch in batches for e in batch) + DONE_FRAME
    assert b"".join(frames(iter(batches), None, None, None)) == expected


def test_a_warning_token_alone_in_its_batch_is_still_rewritten_for_the_public():
    errors = PublicErrors("req1")
    warning = errors.token_prefix + "secret upstream detail"
    for batches in ([[TokenEvent("ok")], [TokenEvent(warning)]], [[TokenEvent("ok"), TokenEvent(warning)]]):
        out = b"".join(frames(iter(batches), None, None, errors))
        assert b"secret" not in out and b"req1" in out and encode_event(TokenEvent("ok")) in out


def test_a_failed_model_call_served_over_http_shows_the_public_warning_not_the_detail():
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(400, {"error": {"message": "secret-upstream-detail"}}))
        with make_engine(fp) as engine:
            status, _, data = call(make_wsgi_app(engine), environ_for(
                "POST", "/v1/chat/stream", json.dumps({"messages": MESSAGES}).encode()))
    assert status.startswith("200") and b"secret-upstream-detail" not in data
    assert b"details are in the server log" in data and data.endswith(DONE_FRAME)


@pytest.mark.parametrize("make", [CancelToken, lambda: __import__("threading").Event(), lambda: None])
def test_the_cancel_flag_follows_set_and_clear(make):
    event = make()
    flag = cancel_flag(event)
    assert flag.cancelled is False
    if event is None:
        return
    event.set()
    assert flag.cancelled is True and event.is_set()
    event.clear()
    assert flag.cancelled is False and not event.is_set()


def test_tokens_and_a_tool_result_keep_their_order_when_the_driver_appends_directly():
    """Tokens are put by the driving thread without a wake-up; the tool's result still comes from its worker."""
    @tool
    def quick() -> str:
        """Answers at once."""
        return "fine"

    result_seen = threading.Event()
    with FakeProvider() as fp:
        # "b" is written once the consumer has the result: both reach it, each from its own thread.
        fp.add_turn(s.text("a"), s.text(block("quick")), s.wait(result_seen, timeout=5), s.text("b"))
        fp.add_turn(s.text("c"))
        with make_engine(fp, [quick]) as engine:
            events = []
            for event in engine.run(MESSAGES):
                events.append(event)
                if isinstance(event, ToolResultEvent):
                    result_seen.set()
    kinds = [(type(e).__name__, getattr(e, "text", None)) for e in events]
    result_at = [k for k, _ in kinds].index("ToolResultEvent")
    assert kinds.index(("TokenEvent", "b")) > result_at > kinds.index(("TokenEvent", "a"))
    assert _tokens(events) == _general(["a", block("quick"), "b"]) + ["c"]


def test_the_tool_lesson_is_made_once_per_tool_set_and_anew_when_a_schema_changes_in_place():
    from streamengine import ToolSpec
    from streamengine import _inline as prompt

    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    specs = [ToolSpec("weather", "The weather.", params)]
    first = prompt.tool_instructions(specs)
    assert prompt.tool_instructions(list(specs)) is first  # the same specs: the same text, not made again
    assert first == prompt._instructions(specs)
    params["properties"]["days"] = {"type": "integer", "description": "how many"}
    changed = prompt.tool_instructions(specs)
    assert "days (integer, optional): how many" in changed and changed == prompt._instructions(specs)
    other = [ToolSpec("weather", "The weather.", dict(params))]  # equal, but another spec: made for it
    assert prompt.tool_instructions(other) == changed


def test_a_token_that_is_not_text_ends_the_stream_with_an_error_frame_on_the_fast_path_too():
    out = b"".join(frames(iter([[TokenEvent("fine")], [TokenEvent(b"bytes")]]), None, None, None))
    assert out.startswith(OK_FRAME + encode_event(TokenEvent("fine"))) and b"event: error" in out
    assert out.endswith(DONE_FRAME)


def test_frames_with_a_payload_are_what_the_json_encoder_and_asdict_make():
    """The done frame's shortcuts (field names by type, the C encoder made once) change no byte."""
    import dataclasses
    import math

    from streamengine.web import _frames

    @dataclasses.dataclass
    class Inner:
        ratio: float = math.nan
        names: tuple = ("a", "\u2028")

    @dataclasses.dataclass
    class Outer:
        count: int = 3
        flag: bool = True
        inner: Inner = dataclasses.field(default_factory=Inner)
        seen: list = dataclasses.field(default_factory=lambda: [1.5, None, {"k": -0.0}])

    payload = {"answer": "x\U0001F600", "telemetry": Outer(), "usage": None, "n": 1e300}
    plain = dataclasses.asdict(Outer())
    plain["inner"]["ratio"] = None  # NaN is sent as null
    plain["inner"]["names"] = list(plain["inner"]["names"])
    expected = json.dumps({"answer": "x\U0001F600", "telemetry": plain, "usage": None, "n": 1e300},
                          separators=(",", ":"), allow_nan=False)
    for _ in range(2):  # the second time from the caches
        frame = _frames.named_frame(b"event: done\ndata: ", payload)
        assert frame == b"event: done\ndata: " + expected.encode() + b"\n\n"


def test_a_response_dropped_without_close_ends_its_run_at_once_not_at_the_next_gc():
    """No reference cycle through the response: a server that forgets close() still frees the run now."""
    from gc_support import collector_off

    from streamengine import Run
    from streamengine.web import SseResponse

    ended = []

    class Engine:
        def run(self, messages, cancel, heartbeat_s=None):
            def batches():
                try:
                    while True:
                        yield [TokenEvent("tok")]
                finally:
                    ended.append(True)
            return Run(batches())

    with collector_off():
        response = SseResponse(Engine(), [], heartbeat_s=None)
        assert next(iter(response)) == OK_FRAME and next(response).startswith(b'data: "tok"')
        del response
        assert ended == [True]


def _every_chunk_general(monkeypatch):
    """Chunks that say they are not text only: the aggregator and the round look at every field of each."""
    from streamengine import Chunk
    from streamengine._clients import openai as openai_parse

    made = Chunk.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.__dict__["text_only"] = False

    monkeypatch.setattr(Chunk, "__init__", init)
    monkeypatch.setattr(openai_parse, "text_chunk", lambda content, model: Chunk(content, model=model))


def _what_a_run_gives(steps, **config):
    with FakeProvider() as fp:
        fp.add_turn(*steps)
        with make_engine(fp, [_noop()], **config) as engine:
            events = list(engine.run(MESSAGES))
    result = events[-1].result
    return [(type(e).__name__, getattr(e, "text", None)) for e in events[:-1]], \
        (result.answer, result.rounds, result.usage, result.error, result.refusal, result.telemetry.stop_reason)


@pytest.mark.parametrize("config", [{}, {"max_answer_chars": 9}, {"max_run_output_chars": 12}])
def test_text_only_chunks_give_what_the_field_by_field_path_gives_over_http(monkeypatch, config):
    """Text-only chunks (``Chunk.text_only``) among reasoning, usage and a finish, within and past the caps."""
    steps = [s.reasoning("hmm"), s.text("Hello"), s.text(" world"), s.reasoning("more"), s.text(" again"),
             s.usage(5, 3)]
    fast = _what_a_run_gives(steps, **config)
    _every_chunk_general(monkeypatch)
    assert _what_a_run_gives(steps, **config) == fast
    assert ("TokenEvent", "Hello") in fast[0]


def test_text_only_is_answer_text_with_at_most_a_model():
    from streamengine import Chunk, ToolCallDelta, Usage

    assert Chunk("a").text_only and Chunk("a", model="m").text_only
    others = [Chunk("a", reasoning="r"), Chunk("a", refusal="no"), Chunk("a", tool_calls=(ToolCallDelta(0),)),
              Chunk("a", is_completed=True), Chunk("a", usage=Usage(1, 1, 2)), Chunk("a", finish_reason="stop"),
              Chunk(), Chunk(model="m"), Chunk(""), Chunk(reasoning="r")]
    assert not any(chunk.text_only for chunk in others)


def test_a_bug_inside_a_round_still_ends_the_run_with_error_and_done_over_http(monkeypatch):
    """The run's generator catches its own unexpected failures (no generator wrapped around it for that)."""
    from streamengine._engine.rounds import RoundRunner

    def broken(self, outcome):
        raise RuntimeError("boom")

    monkeypatch.setattr(RoundRunner, "_account", broken)
    with FakeProvider() as fp:
        fp.add_turn(s.text("shown"))
        with make_engine(fp) as engine:
            events = list(engine.run(MESSAGES))
    assert _tokens(events) == ["shown"] and events[-2].__class__.__name__ == "ErrorEvent"
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.result.telemetry.stop_reason == "internal_error"
    assert done.result.error == "internal error: RuntimeError: boom"
