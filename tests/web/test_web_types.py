"""The web layer's typed contracts hold at run time too: what a type checker is told matches what runs."""
import inspect
import json

from wsgi_support import call, environ_for

from streamengine import DoneEvent, EngineResult, StreamingEngine, TokenEvent
from streamengine.web import StreamApp, make_wsgi_app
from streamengine.web._app import AppOptions
from streamengine.web._serve import serve
from streamengine.web._sse import RunOptions


def test_app_options_name_every_option_of_the_app_but_approve():
    """``serve(engine, **options)`` is checked against AppOptions: it must list StreamApp's options exactly."""
    parameters = inspect.signature(StreamApp.__init__).parameters
    options = {name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY} - {"approve"}
    assert set(AppOptions.__annotations__) == options
    assert AppOptions.__total__ is False
    assert all(parameters[name].default is not inspect.Parameter.empty for name in options)  # all optional


def test_serve_takes_approve_itself_and_passes_the_rest_on():
    parameters = inspect.signature(serve).parameters
    assert "approve" in parameters
    assert parameters["app_options"].kind is inspect.Parameter.VAR_KEYWORD


def test_run_options_are_what_a_streaming_engine_run_takes():
    """The app passes RunOptions as keywords to run()/run_batches(): each one a parameter of both."""
    for method in (StreamingEngine.run, StreamingEngine.run_batches):
        assert set(RunOptions.__annotations__) <= set(inspect.signature(method).parameters), method


def test_an_engine_of_your_own_with_run_only_streams_and_gets_the_scope_it_asks_for():
    """EngineLike needs run(messages, cancel, *, heartbeat_s) only; a scope= app adds conversation_id=."""
    seen = []

    class Echo:
        def run(self, messages, cancel, *, heartbeat_s=None, conversation_id=None):
            seen.append(conversation_id)
            yield TokenEvent(messages[-1].content)
            yield DoneEvent(EngineResult(answer=messages[-1].content))

    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    status, _, data = call(make_wsgi_app(Echo(), scope=lambda environ: "tenant:a"),
                           environ_for("POST", "/v1/chat/stream", body))
    assert status.startswith("200") and b'data: "hi"' in data and seen == ["tenant:a"]
