"""What text may show: URLs and secrets masked by structure and by length, never mangled; and on a
terminal, bidi marks and zero-width characters shown as visible stand-ins, like every other control.

``for_terminal`` is what chat and the CLI print model, tool and MCP text through: a right-to-left mark
or a zero-width space would reorder or hide what a person reads (two tool names that look alike, an
argument that is not what it seems in an approval question).

Private on purpose: the redaction and terminal rules are algorithms checked string by string here;
what users see of them (no key in an error, a log line or a repr; the CLI's output) is tested through
the clients, the stores and the CLI.
"""
from __future__ import annotations

import pytest

from streamengine._clients.http.options import credential_parts
from streamengine._logs import MASK, Redactor, for_terminal, redact_url, redact_urls


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


# --- which parts of a credential header are secrets -------------------------------------------------

def test_only_a_leading_scheme_is_kept_of_a_credential_value():
    token = "sk-hdr-0123456789abcdef"
    assert credential_parts(f"Bearer {token}") == [token]
    assert credential_parts(token) == [token]
    assert credential_parts("Negotiatexyz") == ["Negotiatexyz"]  # one word: the value itself is the secret
    assert credential_parts(f'Digest username="u", response="{token}"') == ['username="u"', f'response="{token}"']


# --- on a terminal ------------------------------------------------------------------------------

INVISIBLE = [0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
             0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF]


@pytest.mark.parametrize("code", INVISIBLE, ids=[f"U+{c:04X}" for c in INVISIBLE])
def test_each_bidi_or_zero_width_character_is_shown_not_obeyed(code):
    assert for_terminal(f"rm{chr(code)}dir") == f"rm<U+{code:04X}>dir"


def test_printable_neighbours_and_right_to_left_letters_are_left_alone():
    text = "\u2010 hyphen, \u2011 no-break hyphen, \u2070 superscript; caf\u00e9 \u05e9\u05dc\u05d5\u05dd \u0627"
    assert for_terminal(text) == text
