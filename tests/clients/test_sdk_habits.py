"""What openai-SDK and litellm users write, and what it must do (over real loopback HTTP)."""
from __future__ import annotations

import io
import sys

import pytest
from cli_support import main
from http_support import MESSAGES

from streamengine import (
    AnthropicClient,
    CompletionOptions,
    ConfigError,
    EngineConfig,
    LlmError,
    LlmHttpError,
    OpenAICompatibleClient,
    RunFailedError,
    StreamingEngine,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.fixture
def fp():
    with FakeProvider() as provider:
        yield provider


# -- extra_body / extra_headers / extra_query -------------------------------------------------------

@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "complete"])
def test_extra_body_headers_and_query_go_where_the_sdk_puts_them(fp, streamed):
    options = CompletionOptions(extra={"extra_body": {"grammar": "root ::= \"yes\""}, "seed": 3,
                                       "extra_headers": {"X-Trace": "t-1"}, "extra_query": {"tenant": "a"}})
    fp.add_turn(s.text("yes"))
    fp.add_turn(s.text("again"))
    with OpenAICompatibleClient(fp.base_url) as client:
        if streamed:
            list(client.stream(MESSAGES, options=options))
        else:
            client.complete(MESSAGES, options=options)
        client.complete(MESSAGES)  # nothing of the first call stays on the client
    first, second = fp.requests
    assert first.json["grammar"] == 'root ::= "yes"' and first.json["seed"] == 3
    assert not any(key in first.json for key in ("extra_body", "extra_headers", "extra_query"))
    assert first.headers["X-Trace"] == "t-1" and first.path.endswith("?tenant=a")
    assert "X-Trace" not in second.headers and "tenant" not in second.path


def test_engine_options_as_a_dict_with_extra_body(fp):
    fp.add_turn(s.text("ok"))
    with StreamingEngine(OpenAICompatibleClient(fp.base_url),
                         config=EngineConfig(models=["m"], options={"extra_body": {"top_k": 5}})) as engine:
        engine.complete(MESSAGES)
        engine.client.close()
    assert fp.requests[0].json["top_k"] == 5 and "extra_body" not in fp.requests[0].json


def test_a_secret_in_extra_headers_is_redacted_from_errors(fp):
    fp.add_turn(s.http_error(401, {"error": {"message": "bad key sk-live-XYZ123 for you"}}))
    with OpenAICompatibleClient(fp.base_url) as client, pytest.raises(LlmHttpError) as info:
        client.complete(MESSAGES, options=CompletionOptions(extra={"extra_headers": {"api-key": "sk-live-XYZ123"}}))
    assert "sk-live-XYZ123" not in str(info.value) and "***" in str(info.value)


# -- the constructors -------------------------------------------------------------------------------

def test_no_base_url_reads_openai_base_url_as_the_sdk_does(fp, monkeypatch):
    monkeypatch.delenv("STREAMENGINE_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", fp.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    fp.add_turn(s.text("hi"))
    with OpenAICompatibleClient() as client:
        assert client.base_url == fp.base_url
        client.complete(MESSAGES)
    assert fp.requests[0].headers["Authorization"] == "Bearer sk-env"


@pytest.mark.parametrize("client_class", [OpenAICompatibleClient, AnthropicClient])
def test_timeout_max_retries_and_default_headers_are_taken(fp, client_class):
    with client_class(fp.base_url, api_key="k", timeout=3.5, max_retries=0,
                      default_headers={"X-App": "mine"}, headers={"X-Other": "o"}) as client:
        assert client.connect_timeout == 3.5 and client.max_retries == 0
        assert client._headers == {"X-App": "mine", "X-Other": "o"}
    with pytest.raises(ConfigError, match="not both"):
        client_class(fp.base_url, timeout=1, connect_timeout=2)
    with pytest.raises(ConfigError, match="max_retries"):
        client_class(fp.base_url, max_retries=-1)


def test_the_clients_max_retries_decides_how_often_a_rate_limit_is_retried(fp):
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"retry-after": "0"}))
    fp.add_turn(s.text("late"))
    with StreamingEngine(OpenAICompatibleClient(fp.base_url, max_retries=0),
                         config=EngineConfig(models=["m"], max_retries=2)) as engine:
        result = engine.complete(MESSAGES, raise_on_error=False)
        engine.client.close()
    assert fp.request_count == 1 and result.telemetry.stop_reason == "llm_error"


# -- per-run overrides; complete() raises ---------------------------------------------------------------

def test_a_run_may_override_the_model_and_options(fp):
    fp.add_turn(s.text("one"))
    fp.add_turn(s.text("two"))
    config = EngineConfig(models=["base"], options={"temperature": 0.1, "seed": 1})
    with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=config) as engine:
        engine.complete(MESSAGES, model="other", options={"temperature": 0.9, "top_p": 0.5})
        engine.complete(MESSAGES)
        engine.client.close()
    first, second = (r.json for r in fp.requests)
    assert (first["model"], first["temperature"], first["seed"], first["top_p"]) == ("other", 0.9, 1, 0.5)
    assert (second["model"], second["temperature"], "top_p" in second) == ("base", 0.1, False)


def test_complete_raises_when_no_answer_was_produced_and_the_flag_keeps_the_old_result(fp):
    fp.add_turn(s.http_error(400, {"error": {"message": "bad request"}}))
    fp.add_turn(s.http_error(400, {"error": {"message": "bad request"}}))
    with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=EngineConfig(models=["m"])) as engine:
        with pytest.raises(RunFailedError, match="bad request") as info:
            engine.complete(MESSAGES)
        old = engine.complete(MESSAGES, raise_on_error=False)
        engine.client.close()
    assert isinstance(info.value, LlmError) and info.value.result.telemetry.stop_reason == "llm_error"
    assert old.answer.startswith("\u26a0\ufe0f LLM error: ") and old.error


def test_complete_returns_a_partial_answer_with_its_error(fp):
    fp.add_turn(s.text("half an answer"), s.drop())
    with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=EngineConfig(models=["m"])) as engine:
        result = engine.complete(MESSAGES)
        engine.client.close()
    assert result.answer == "half an answer" and result.error


def test_one_completion_timeout_default_everywhere(fp, monkeypatch, capsys):
    """The library's 600 s cap on one model call, and the CLI's engine built with it when no --timeout is given."""
    assert EngineConfig(models=["m"]).completion_timeout == 600.0
    with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=EngineConfig(models=["m"])) as engine:
        assert engine.config.completion_timeout == 600.0
        engine.client.close()
    made = []
    post_init = EngineConfig.__post_init__

    def noting(config, *args):
        post_init(config, *args)
        made.append(config)

    monkeypatch.setattr(EngineConfig, "__post_init__", noting)
    monkeypatch.delenv("STREAMENGINE_TIMEOUT", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # an empty pipe, not a terminal
    fp.add_turn(s.text("ok"))
    assert main(["chat", "hi", "-m", "m", "--base-url", fp.base_url]) == 0
    assert made and {config.completion_timeout for config in made} == {600.0}
    capsys.readouterr()
    assert main(["chat", "--help"]) == 0
    assert "STREAMENGINE_TIMEOUT; default 600)" in " ".join(capsys.readouterr().out.split())


def test_the_anthropic_client_reads_the_extras_alike():
    with FakeProvider(wire="anthropic") as fp, AnthropicClient(fp.base_url, api_key="k") as client:
        fp.add_turn(s.text("ok"))
        options = CompletionOptions(model="claude-x", extra={"extra_body": {"top_k": 4},
                                                             "extra_headers": {"anthropic-beta": "b-1"}})
        list(client.stream(MESSAGES, options=options))
    request = fp.requests[0]
    assert request.json["top_k"] == 4 and "extra_body" not in request.json
    assert request.headers["anthropic-beta"] == "b-1"
