"""``chat -a PATH|URL`` and ``--at PATH TYPE``: attachments reach the provider as parts, or the command says why not.

In-process runs with ``capsys`` check what reached the FakeProvider and the
errors; one run on a real pseudo-terminal checks the interactive chat
sends the attachment with its first message and keeps it in the conversation.
"""
from __future__ import annotations

import base64
import os
import sys

import pytest
from cli_support import clean_env, run  # noqa: F401  (fixtures)
from parts_support import IMAGE_BY_URL, PDF, PNG, PNG_URL, WAV, b64
from pty_support import Terminal, child_env

from streamengine._cli import attach
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "heron.png").write_bytes(PNG)
    (tmp_path / "scan.bin").write_bytes(PDF)
    (tmp_path / "call.wav").write_bytes(WAV)
    (tmp_path / "notes.qqq").write_bytes(b"?")
    return tmp_path


def chat(capsys, fp, *flags):
    return run(capsys, "chat", "What is this?", "-m", "m", "--base-url", fp.base_url, "--no-log", *flags)


def test_files_and_urls_go_with_the_prompt_in_the_order_given(capsys, files):
    with FakeProvider() as fp:
        fp.add_turn(s.text("A heron and a scan."))
        rc, out, err = chat(capsys, fp, "-a", str(files / "heron.png"), "-a", IMAGE_BY_URL,
                            "--at", str(files / "scan.bin"), "application/pdf", "-a", str(files / "call.wav"))
        assert (rc, out) == (0, "A heron and a scan.\n"), err
        (request,) = fp.requests
    user = request.json["messages"][-1]
    assert user["content"][0] == {"type": "text", "text": "What is this?"}
    assert request.parts == [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "image_url", "image_url": {"url": IMAGE_BY_URL}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64," + b64(PDF), "filename": "scan.bin"}},
        {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
    ]
    assert base64.b64decode(request.parts[0]["image_url"]["url"].split(",", 1)[1]) == PNG


def test_a_part_the_providers_api_cannot_carry_fails_before_any_request(capsys, files):
    with FakeProvider(wire="anthropic") as fp:
        rc, out, err = run(capsys, "chat", "Transcribe.", "--provider", "anthropic", "--base-url", fp.base_url,
                           "--api-key", "sk-ant", "-m", "claude-x", "--no-log", "-a", str(files / "call.wav"))
        assert fp.request_count == 0
    assert rc != 0 and out == ""
    assert "audio part (audio/wav" in err and "the Anthropic Messages API" in err and "Traceback" not in err


@pytest.mark.parametrize("flags, words", [
    (["-a", "{files}/notes.qqq"], ["cannot tell its type from the name", "--at {files}/notes.qqq TYPE"]),
    (["--at", "{files}/notes.qqq", "png"], ["'png' is not a media type"]),
    (["-a", "{files}/missing.png"], ["cannot read attachment {files}/missing.png", "No such file"]),
    (["--at", "{files}/heron.png", "audio/ogg"], ["audio/ogg audio cannot be sent", "WAV or MP3"]),
    (["-a", "https://files.example/talk.mp3"], ["audio goes inline only"]),
])
def test_an_attachment_that_cannot_go_is_a_usage_error_naming_it(capsys, files, flags, words):
    with FakeProvider() as fp:
        rc, _, err = chat(capsys, fp, *[f.format(files=files) for f in flags])
        assert fp.request_count == 0
    assert rc == 2, err
    for word in words:
        assert word.format(files=files) in err


def test_a_file_over_the_cap_is_refused_before_it_is_read_whole(capsys, files, monkeypatch):
    monkeypatch.setattr(attach, "MAX_ATTACHMENT_BYTES", len(PDF) - 1)
    with FakeProvider() as fp:
        rc, _, err = chat(capsys, fp, "--at", str(files / "scan.bin"), "application/pdf")
        assert fp.request_count == 0
    assert rc == 2 and f"larger than {len(PDF) - 1} bytes" in err


def test_at_a_terminal_the_attachment_goes_with_the_first_message_and_stays(files):
    with FakeProvider() as fp:
        fp.add_turn(s.text("A heron."))
        fp.add_turn(s.text("Grey."))
        argv = ["chat", "-m", "m", "--base-url", fp.base_url, "--no-log", "-a", str(files / "heron.png")]
        with Terminal(argv, env=child_env(NO_COLOR="1", PYTHONPATH=os.pathsep.join(sys.path))) as term:
            term.wait_for(b"> ")
            term.type(b"What bird is this?\n")
            term.wait_for(b"A heron.")
            term.wait_for(b"> ")
            term.type(b"What colour?\n")
            term.wait_for(b"Grey.")
            term.wait_for(b"> ")
            term.type(b"\x04")
            rc, _ = term.finish()
        first, second = fp.requests
    assert rc == 0, term.screen
    assert first.parts == [{"type": "image_url", "image_url": {"url": PNG_URL}}]
    asked = [m["content"] for m in second.json["messages"] if m["role"] == "user"]
    assert asked == [[{"type": "text", "text": "What bird is this?"},
                      {"type": "image_url", "image_url": {"url": PNG_URL}}], "What colour?"]
