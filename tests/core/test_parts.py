"""Content parts in messages: OpenAI's list form is read into records, and refused clearly when it is wrong."""
from __future__ import annotations

import base64

import pytest
from parts_support import IMAGE_BY_URL, PDF, PDF_URL, PNG, PNG_URL, WAV, b64

from streamengine import AudioPart, ConfigError, FilePart, ImagePart, Message, TextPart
from streamengine._messages import as_message

VISION = [{"type": "text", "text": "What bird is this?"},
          {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
          {"type": "text", "text": "Answer in one word."}]


def test_a_list_of_openai_parts_becomes_records_and_content_keeps_the_text():
    message = as_message({"role": "user", "content": VISION})
    assert message.parts == (TextPart("What bird is this?"), ImagePart(PNG_URL, "low"),
                             TextPart("Answer in one word."))
    assert message.content == "What bird is this?\nAnswer in one word."
    assert message.has_media


def test_chat_completions_gets_the_parts_back_as_they_were_sent():
    every_kind = VISION + [
        {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
        {"type": "file", "file": {"file_data": PDF_URL, "filename": "notes.pdf"}},
        {"type": "file", "file": {"file_id": "file-abc123"}},
    ]
    assert as_message({"role": "user", "content": every_kind}).to_openai() == {"role": "user", "content": every_kind}


def test_a_plain_string_has_no_parts_and_a_text_only_list_no_media():
    assert as_message({"role": "user", "content": "hi"}).parts == ()
    text_only = as_message({"role": "assistant", "content": [{"type": "text", "text": "a"}]})
    assert text_only.content == "a" and not text_only.has_media


def test_records_are_accepted_as_parts_too():
    message = as_message({"role": "user", "content": [TextPart("hi"), ImagePart(IMAGE_BY_URL)]})
    assert message.parts[1].url == IMAGE_BY_URL and message.content == "hi"
    direct = Message("user", "hi", parts=(TextPart("hi"), FilePart(data=PDF_URL, filename="a.pdf")))
    assert direct.to_openai()["content"][1] == {"type": "file", "file": {"file_data": PDF_URL, "filename": "a.pdf"}}


def test_sizes_and_media_types_are_read_without_decoding():
    image = ImagePart(PNG_URL)
    assert (image.media_type, image.size) == ("image/png", len(PNG))
    assert ImagePart(IMAGE_BY_URL).media_type == "image/jpeg" and ImagePart(IMAGE_BY_URL).size == 0
    assert AudioPart(b64(WAV), "wav").size == len(WAV) and AudioPart(b64(WAV), "wav").media_type == "audio/wav"
    assert FilePart(data=PDF_URL).size == len(PDF)
    for n in range(7):  # every padding length
        assert ImagePart("data:image/png;base64," + b64(b"x" * n) if n else PNG_URL).size == (n or len(PNG))


def test_a_parts_repr_never_shows_its_data():
    message = as_message({"role": "user", "content": VISION})
    shown = repr(message)
    assert base64.b64encode(PNG).decode()[:20] not in shown
    assert "image part (image/png, " in shown


@pytest.mark.parametrize("content, words", [
    ([{"type": "video_url", "video_url": {}}], ["content[0]", "'video_url'", "'image_url'"]),
    ([{"type": "image_url", "image_url": "https://x.example/a.png"}], ["content[0].image_url must be an object"]),
    ([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}], ["http(s) URL", "file:///etc/passwd"]),
    ([{"type": "image_url", "image_url": {"url": "data:text/html;base64,PGI+"}}], ["not an image type"]),
    ([{"type": "image_url", "image_url": {"url": "data:image/png,rawtext"}}], ["not base64"]),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}], ["not valid base64"]),
    ([{"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "ogg"}}], ["'mp3', 'wav'", "'ogg'"]),
    ([{"type": "file", "file": {}}], ["exactly one of data", "none"]),
    ([{"type": "file", "file": {"file_data": PDF_URL, "file_id": "file-1"}}], ["exactly one of", "data, file_id"]),
    ([{"type": "file", "file": {"file_data": b64(PDF)}}], ["must be a data URL"]),
    ([{"type": "text", "text": 3}], ["content[0].text must be a string"]),
    ([7], ["content[0] must be a content part"]),
    ({"type": "text", "text": "a dict, not a list"}, ["string or a list of content parts", "dict"]),
])
def test_a_wrong_part_is_refused_naming_where_and_what_to_send(content, words):
    with pytest.raises(ConfigError) as info:
        as_message({"role": "user", "content": content})
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("role", ["system", "assistant", "tool"])
def test_media_goes_only_in_a_user_message(role):
    with pytest.raises(ConfigError, match=f"'{role}' messages may hold only text parts .image part"):
        as_message({"role": role, "content": VISION})


def test_an_error_quotes_only_the_start_of_a_long_url():
    with pytest.raises(ConfigError) as info:
        ImagePart("ftp://" + "x" * 10_000)
    assert len(str(info.value)) < 200
