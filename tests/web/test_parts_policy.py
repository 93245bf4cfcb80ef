"""Images, audio and files from a browser: refused by default, let in as the application's PartsPolicy says.

Every request goes over real HTTP to the app under waitress, with a real
engine on a FakeProvider, so a refusal is seen as a browser sees it (a 400
naming the field and the option) and an allowed part is seen where it
lands: in the provider's request.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
import requests
from parts_support import IMAGE_BY_URL, PDF_URL, PNG, PNG_URL, WAV, b64, data_url
from wsgi_support import make_engine, serving, sse, tokens_of

from streamengine import AnthropicClient, ConfigError, EngineConfig, StreamingEngine
from streamengine.runs import MemoryRunLog
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.web import PartsPolicy, RequestRejected, make_wsgi_app, messages_from_request

pytestmark = pytest.mark.usefixtures("no_thread_leak")

QUESTION = {"type": "text", "text": "What bird is this?"}
IMAGE = {"type": "image_url", "image_url": {"url": PNG_URL}}


def ask(*parts: Dict[str, Any]) -> Dict[str, Any]:
    return {"messages": [{"role": "user", "content": [QUESTION, *parts]}]}


def post(url: str, body: Dict[str, Any]) -> requests.Response:
    return requests.post(f"{url}/v1/chat/stream", json=body, timeout=20, stream=True)


def answered(url: str, body: Dict[str, Any]) -> str:
    """The answer streamed to this request (read to its end: the run goes as the client reads)."""
    resp = post(url, body)
    assert resp.status_code == 200, resp.text
    return "".join(tokens_of(sse(resp)))


def refused(url: str, body: Dict[str, Any], field: str, *words: str) -> None:
    resp = post(url, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert error["field"] == field
    for word in words:
        assert word in error["error"]
    assert b64(PNG)[:16] not in error["error"]


def test_by_default_a_request_brings_text_only_and_the_400_names_the_option():
    with FakeProvider() as fp, make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
        refused(url, ask(IMAGE), "messages[0].content[1]", "does not take image parts (it takes text only)",
                "make_wsgi_app(engine, parts=PartsPolicy(allow=('image',)))")
        fp.add_turn(s.text("A heron."))
        assert answered(url, ask({"type": "text", "text": "One word."})) == "A heron."  # text parts pass
        assert fp.request_count == 1 and fp.requests[0].parts == []
        assert fp.requests[0].json["messages"][-1]["content"][1] == {"type": "text", "text": "One word."}


def test_an_allowed_image_reaches_the_provider_as_sent():
    policy = PartsPolicy(allow=("image",))
    with FakeProvider() as fp, make_engine(fp) as engine, serving(make_wsgi_app(engine, parts=policy)) as url:
        fp.add_turn(s.text("A heron."))
        assert answered(url, ask(IMAGE)) == "A heron."
        assert fp.requests[0].parts == [IMAGE]
        refused(url, ask({"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}}),
                "messages[0].content[1]", "does not take audio parts (it takes image parts)",
                "PartsPolicy(allow=('image', 'audio'))")
        assert fp.request_count == 1


def test_urls_pass_only_when_the_application_says_so():
    by_url = {"type": "image_url", "image_url": {"url": IMAGE_BY_URL}}
    with FakeProvider() as fp, make_engine(fp) as engine:
        with serving(make_wsgi_app(engine, parts=PartsPolicy(allow=("image", "file")))) as url:
            refused(url, ask(by_url), "messages[0].content[1]", "points at a URL", "PartsPolicy(urls=True)",
                    "data:<type>;base64")
            refused(url, ask({"type": "file", "file": {"file_url": "https://files.example/a.pdf"}}),
                    "messages[0].content[1]", "points at a URL")
            refused(url, ask({"type": "file", "file": {"file_id": "file-of-another-user"}}),
                    "messages[0].content[1]", "stored file (file_id)")
            assert fp.request_count == 0
        with serving(make_wsgi_app(engine, parts=PartsPolicy(allow=("image",), urls=True))) as url:
            fp.add_turn(s.text("A heron."))
            assert answered(url, ask(by_url)) == "A heron."
        assert fp.requests[0].parts == [by_url]


def test_size_caps_per_part_and_per_request():
    policy = PartsPolicy(allow=("image", "file"), max_part_bytes=len(PNG), max_request_bytes=2 * len(PNG))
    big = {"type": "image_url", "image_url": {"url": data_url("image/png", PNG + b"\x00")}}
    with FakeProvider() as fp, make_engine(fp) as engine, serving(make_wsgi_app(engine, parts=policy)) as url:
        refused(url, ask(IMAGE, big), "messages[0].content[2]", f"over the {len(PNG)}-byte limit",
                "PartsPolicy.max_part_bytes")
        earlier = {"role": "user", "content": [QUESTION, IMAGE, IMAGE]}
        refused(url, {"messages": [earlier, {"role": "assistant", "content": "Two herons."},
                                   {"role": "user", "content": [QUESTION, IMAGE]}]},
                "messages[2].content[1]", f"more than {2 * len(PNG)} bytes", "PartsPolicy.max_request_bytes")
        assert fp.request_count == 0


def test_the_body_cap_makes_room_for_what_the_policy_lets_in():
    photo = data_url("image/jpeg", b"\xff\xd8" + b"\x00" * 1_500_000)  # 2 MB of base64, over max_body_bytes
    body = ask({"type": "image_url", "image_url": {"url": photo}})
    with FakeProvider() as fp, make_engine(fp) as engine:
        with serving(make_wsgi_app(engine, max_body_bytes=100_000)) as url:
            resp = post(url, body)
            assert resp.status_code == 400 and resp.json()["field"] == "body"
        with serving(make_wsgi_app(engine, max_body_bytes=100_000, parts=PartsPolicy(allow=("image",)))) as url:
            fp.add_turn(s.text("A jpeg."))
            assert answered(url, body) == "A jpeg."
        assert fp.requests[0].parts[0]["image_url"]["url"] == photo


def test_a_malformed_part_is_a_400_naming_it():
    with FakeProvider() as fp, make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
        refused(url, ask({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}),
                "messages[0].content", "messages[0].content[1]", "not valid base64")
        refused(url, {"messages": [{"role": "assistant", "content": [QUESTION, IMAGE]},
                                   {"role": "user", "content": "and?"}]},
                "messages[0].content", "'assistant' messages may hold only text parts")
        assert fp.request_count == 0


def test_a_view_of_your_own_reads_parts_with_the_same_rules():
    payload = ask({"type": "file", "file": {"file_data": PDF_URL, "filename": "notes.pdf"}})
    with pytest.raises(RequestRejected, match="PartsPolicy"):
        messages_from_request(payload)
    messages: List[Any] = messages_from_request(payload, parts=PartsPolicy(allow=("file",)), system_prompt="Brief.")
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[1].content == "What bird is this?" and messages[1].parts[1].filename == "notes.pdf"
    assert json.dumps(messages[1].to_openai()["content"][1]["file"]["file_data"]) == json.dumps(PDF_URL)


@pytest.mark.parametrize("kwargs, words", [
    ({"allow": "image"}, "write allow=('image',)"),
    ({"allow": ("video",)}, "image, audio, file"),
    ({"urls": "yes"}, "True or False"),
    ({"max_part_bytes": 0}, "PartsPolicy.max_part_bytes"),
])
def test_a_wrong_policy_is_refused_at_construction(kwargs, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        PartsPolicy(**kwargs)


def test_make_wsgi_app_takes_only_a_policy():
    with FakeProvider() as fp, make_engine(fp) as engine, pytest.raises(ConfigError, match="must be a PartsPolicy"):
        make_wsgi_app(engine, parts={"allow": ["image"]})


def test_a_trusted_backend_sends_any_part_without_a_policy():
    stored = {"type": "file", "file": {"file_id": "file-of-our-own"}}
    with FakeProvider() as fp, make_engine(fp) as engine, \
            serving(make_wsgi_app(engine, trusted_messages=True)) as url:
        fp.add_turn(s.text("Read."))
        assert answered(url, ask(IMAGE, stored)) == "Read."
        assert fp.requests[0].parts == [IMAGE, stored]


@pytest.mark.parametrize("runs", [None, MemoryRunLog])
def test_a_part_the_models_api_cannot_take_is_the_clients_422_not_the_servers_503(runs):
    """The policy lets audio in, the model behind it (Anthropic) takes none: the request's fault, said before
    anything is sent, so a client does not retry it as it would a 503."""
    audio = {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}}
    with FakeProvider(wire="anthropic") as fp, \
            StreamingEngine(AnthropicClient(fp.base_url, api_key="sk-parts"), [], EngineConfig(models=["claude"])) \
            as engine:
        app = make_wsgi_app(engine, parts=PartsPolicy(allow=("audio",)), runs=runs() if runs else None)
        with serving(app) as url:
            resp = post(url, ask(audio))
            assert resp.status_code == 422, resp.text
            assert "cannot be sent" in resp.json()["error"] and "send it as text" in resp.json()["error"]
        assert fp.request_count == 0
