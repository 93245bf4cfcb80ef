"""What text may show of URLs and secrets: masked by structure and by length, never mangled.

Private on purpose: the redaction rules are an algorithm checked string by string here; what users
see of them (no key in an error, a log line or a repr) is tested through the clients and the stores.
"""
from __future__ import annotations

import pytest

from streamengine._logs import MASK, Redactor, redact_url, redact_urls


@pytest.mark.parametrize("url, shown", [
    ("http://user:PASSWORD@host:8080/v1", "http://***@host:8080/v1"),
    ("https://ghp_tokenvalue@github.com/a/b.git", "https://***@github.com/a/b.git"),
    ("https://mcp.example.com/sse?token=abc&mode=x", "https://mcp.example.com/sse?token=***&mode=***"),
    ("https://h/p?flag&empty=&k=v#part", "https://h/p?flag&empty=&k=***#part"),
    ("https://host/path", "https://host/path"),
])
def test_a_url_keeps_where_it_goes_and_loses_its_credentials(url, shown):
    assert redact_url(url) == shown


def test_urls_inside_text_are_found_absolute_and_relative():
    text = ("HTTPConnectionPool(host='h', port=80): Max retries exceeded with url: /v1/chat?key=s3cr3t "
            "(to 'https://u:pw@h/x?token=t0k')")
    shown = redact_urls(text)
    assert "s3cr3t" not in shown and "pw" not in shown and "t0k" not in shown
    assert "/v1/chat?key=***" in shown and "https://***@h/x?token=***" in shown


def test_prose_with_slashes_and_question_marks_is_left_alone():
    text = "Is a/b ok? see x-large and user@example.com"
    assert redact_urls(text) == text


def test_only_secrets_long_enough_to_be_secrets_are_masked():
    redact = Redactor(["ollama", "x", "sk-live-0123456789"])
    assert redact("ollama pull llama3.2 with model x-large") == "ollama pull llama3.2 with model x-large"
    assert redact("key sk-live-0123456789 refused") == f"key {MASK} refused"


def test_a_secret_is_masked_raw_and_as_a_repr_shows_it():
    secret = "abc\\def'ghij"
    redact = Redactor([secret])
    assert secret not in redact(f"raw {secret}") and repr(secret)[1:-1] not in redact(f"repr {secret!r}")
