"""RecordedRequest.parts: the images, audio and files a request carried, in its wire's own shape."""
from __future__ import annotations

import pytest
import requests

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

IMAGE = {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}


def test_parts_are_every_content_block_but_text_and_tool_plumbing():
    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.text("ok"))
        body = {"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                                         {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                                         "data": "notes"}}]}]}
        requests.post(f"{fp.base_url}/v1/messages", json=body, timeout=10).close()
        requests.post(f"{fp.base_url}/v1/messages", data=b"not json", timeout=10).close()
        parts, none = (r.parts for r in fp.requests)
    assert parts == [IMAGE, body["messages"][2]["content"][1]]
    assert none == []


def test_responses_input_items_are_read_too():
    image = {"type": "input_image", "image_url": "https://x.example/a.png", "detail": "auto"}
    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.text("ok"))
        requests.post(f"{fp.base_url}/responses", timeout=10, json={"model": "m", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "see"}, image]},
            {"type": "function_call_output", "call_id": "c", "output": "x"}]}).close()
        assert fp.requests[0].parts == [image]
