"""Content parts of a message: text, images, audio and files, as OpenAI's content lists name them.

A user message may be a list of parts instead of a string
(``[{"type": "text", ...}, {"type": "image_url", ...}]``): vision is the most
common reason an openai SDK user sends one.  Each part becomes a small frozen
record here; :class:`~streamengine._messages.Message` keeps them in
``parts`` and their text, joined, in ``content`` (:func:`text_of`), so what
works on text (inline tool parsing, output caps, RAG filing, logs) keeps
working on it.  Each wire translates the records when it builds a request,
and says which it cannot carry (``Wire.cannot_carry``).

Inline data is a data URL (``data:image/png;base64,...``), as OpenAI's own
``image_url`` and ``file_data`` take it, so one form travels from a browser
or a file to every wire.  :attr:`ImagePart.size` and the others count the
decoded bytes without decoding them: a size cap costs nothing.
"""
from __future__ import annotations

import binascii
import mimetypes
import re
import urllib.parse
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple, Union

from ._errors import ConfigError

#: The audio formats OpenAI's ``input_audio`` takes, and their media types.
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg"}
_AUDIO_FORMAT_OF = {media: name for name, media in AUDIO_FORMATS.items()}

_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[^;,]*)*);base64,", re.I)
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


def decoded_size(data: str) -> int:
    """The number of bytes base64 ``data`` decodes to, counted without decoding it."""
    data = data.rstrip("\n")
    return len(data) * 3 // 4 - data.count("=", max(0, len(data) - 2))


def split_data_url(url: str, what: str) -> Optional[Tuple[str, str]]:
    """``(media type, base64 data)`` of a ``data:...;base64,`` URL; None for any other URL.

    A data URL that is not base64 (or whose data is not) is refused: every
    wire sends inline data as base64, and a malformed one would only fail
    at the provider.
    """
    if url[:5].lower() != "data:":
        return None
    match = _DATA_URL.match(url)
    if match is None:
        raise ConfigError(f"{what} is a data URL that is not base64; write it as "
                          f"'data:<media type>;base64,<data>'")
    data = url[match.end():]
    if not _BASE64.match(data) or len(data) % 4:
        raise ConfigError(f"{what} holds data that is not valid base64 ({len(data)} characters after 'base64,')")
    return (match.group(1) or "application/octet-stream").lower(), data


def data_url(media_type: str, data: bytes) -> str:
    """``data`` as a base64 data URL of ``media_type``: the inline form every part takes."""
    return f"data:{media_type};base64,{binascii.b2a_base64(data, newline=False).decode('ascii')}"


def is_web_url(url: str) -> bool:
    """An ``http(s)://`` URL with a host: the only kind besides data URLs a part may point at."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)


def guessed_type(name: str) -> Optional[str]:
    """The media type a file name or URL path suggests (``mimetypes``), or None."""
    path = urllib.parse.urlsplit(name).path if is_web_url(name) else name
    return mimetypes.guess_type(path, strict=False)[0]



def attachment_part(media_type: str, url: str, filename: Optional[str] = None) -> Dict[str, Any]:
    """A frontend's attachment (a media type and a ``data:`` or web URL: useChat's file part, AG-UI's
    binary content) as the OpenAI content part a request policy then judges like any other."""
    if media_type.lower().startswith("image/"):
        return {"type": "image_url", "image_url": {"url": url}}
    inline = split_data_url(url, f"the {media_type} attachment's url")
    audio = _AUDIO_FORMAT_OF.get(media_type.lower())
    if audio is not None and inline is not None:
        return {"type": "input_audio", "input_audio": {"data": inline[1], "format": audio}}
    file: Dict[str, Any] = {"file_data": url} if inline is not None else {"file_url": url}
    if filename:
        file["filename"] = filename
    return {"type": "file", "file": file}

@dataclass(frozen=True)
class TextPart:
    """Text, as ``{"type": "text", "text": ...}``."""

    text: str
    kind: ClassVar[str] = "text"

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8", "surrogatepass"))

    @property
    def media_type(self) -> Optional[str]:
        return "text/plain"

    def describe(self) -> str:
        return "text part"

    def to_openai(self) -> Dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass(frozen=True)
class ImagePart:
    """An image: ``url`` is an ``https://`` URL or a ``data:image/...;base64,`` URL; ``detail`` is OpenAI's
    (``"low"``, ``"high"``, ``"auto"``), None to leave it to the provider."""

    url: str
    detail: Optional[str] = None
    kind: ClassVar[str] = "image"

    def __post_init__(self) -> None:
        inline = self.inline
        if inline is None and not is_web_url(self.url):
            raise ConfigError(f"an image part's url must be an http(s) URL or a data:image/...;base64, URL, "
                              f"got {_start_of(self.url)!r}")
        if inline is not None and not inline[0].startswith("image/"):
            raise ConfigError(f"an image part's data URL says {inline[0]!r}, not an image type; "
                              f"send a file part for other files")

    @cached_property
    def inline(self) -> Optional[Tuple[str, str]]:
        """``(media type, base64 data)`` when the image is in the URL itself, else None (read once)."""
        return split_data_url(self.url, "an image part's url")

    @property
    def media_type(self) -> Optional[str]:
        inline = self.inline
        return inline[0] if inline else guessed_type(self.url)

    @property
    def size(self) -> int:
        """Decoded bytes of an inline image; 0 for one by URL (the provider fetches it)."""
        inline = self.inline
        return decoded_size(inline[1]) if inline else 0

    def __repr__(self) -> str:
        """Names the part, never its data: a data URL can be megabytes, and reprs reach logs."""
        return f"<ImagePart: {self.describe()}>"

    def describe(self) -> str:
        return _described("image", self.media_type, self.size, None if self.inline else "by URL")

    def to_openai(self) -> Dict[str, Any]:
        image: Dict[str, Any] = {"url": self.url}
        if self.detail is not None:
            image["detail"] = self.detail
        return {"type": "image_url", "image_url": image}


@dataclass(frozen=True)
class AudioPart:
    """Audio, base64 ``data`` in ``format`` (``"wav"`` or ``"mp3"``), as OpenAI's ``input_audio``."""

    data: str
    format: str
    kind: ClassVar[str] = "audio"

    def __post_init__(self) -> None:
        if self.format not in AUDIO_FORMATS:
            raise ConfigError(f"an audio part's format must be one of {sorted(AUDIO_FORMATS)}, got {self.format!r}")
        if not _BASE64.match(self.data) or len(self.data) % 4:
            raise ConfigError("an audio part's data must be base64 (no data: prefix)")

    @property
    def media_type(self) -> Optional[str]:
        return AUDIO_FORMATS[self.format]

    @property
    def size(self) -> int:
        return decoded_size(self.data)

    def __repr__(self) -> str:
        """Names the part, never its data: a data URL can be megabytes, and reprs reach logs."""
        return f"<AudioPart: {self.describe()}>"

    def describe(self) -> str:
        return _described("audio", self.media_type, self.size, None)

    def to_openai(self) -> Dict[str, Any]:
        return {"type": "input_audio", "input_audio": {"data": self.data, "format": self.format}}


@dataclass(frozen=True)
class FilePart:
    """A file (a PDF, a text file): exactly one of ``data`` (a ``data:...;base64,`` URL), ``file_id`` (one
    the provider's Files API gave) or ``url`` (an ``https://`` URL the provider fetches); ``filename``
    names it to the model."""

    data: Optional[str] = None
    file_id: Optional[str] = None
    filename: Optional[str] = None
    url: Optional[str] = None
    kind: ClassVar[str] = "file"

    def __post_init__(self) -> None:
        given = [name for name in ("data", "file_id", "url") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError(f"a file part needs exactly one of data (a data URL), file_id or url, got "
                              f"{', '.join(given) or 'none'}")
        if self.data is not None and self.inline is None:
            raise ConfigError("a file part's data must be a data URL, 'data:<media type>;base64,<data>' "
                              "(as OpenAI's file_data)")
        if self.url is not None and not is_web_url(self.url):
            raise ConfigError(f"a file part's url must be an http(s) URL, got {_start_of(self.url)!r}")

    @cached_property
    def inline(self) -> Optional[Tuple[str, str]]:
        """``(media type, base64 data)`` of a file given inline, else None (read once)."""
        return split_data_url(self.data, "a file part's data") if self.data is not None else None

    @property
    def media_type(self) -> Optional[str]:
        inline = self.inline
        if inline is not None:
            return inline[0]
        return guessed_type(self.filename or self.url or "")

    @property
    def size(self) -> int:
        inline = self.inline
        return decoded_size(inline[1]) if inline else 0

    def __repr__(self) -> str:
        """Names the part, never its data: a data URL can be megabytes, and reprs reach logs."""
        return f"<FilePart: {self.describe()}>"

    def describe(self) -> str:
        how = "by file_id" if self.file_id is not None else "by URL" if self.url is not None else None
        name = f" {self.filename!r}" if self.filename else ""
        return _described(f"file{name}", self.media_type, self.size, how)

    def to_openai(self) -> Dict[str, Any]:
        file: Dict[str, Any] = {}
        if self.data is not None:
            file["file_data"] = self.data
        if self.file_id is not None:
            file["file_id"] = self.file_id
        if self.url is not None:  # no Chat Completions form: the wire refuses it before sending
            file["file_url"] = self.url
        if self.filename is not None:
            file["filename"] = self.filename
        return {"type": "file", "file": file}


Part = Union[TextPart, ImagePart, AudioPart, FilePart]

PART_TYPES = (TextPart, ImagePart, AudioPart, FilePart)


def _described(what: str, media_type: Optional[str], size: int, how: Optional[str]) -> str:
    details = [d for d in (media_type, f"{size} bytes" if size else None, how) if d]
    return f"{what} part ({', '.join(details)})" if details else f"{what} part"


def _start_of(text: str) -> str:
    """What an error may quote of a URL: its start (a data URL can be megabytes)."""
    return text if len(text) <= 40 else text[:37] + "..."


def text_of(parts: Sequence[Part]) -> str:
    """The text of a list of parts, joined by newlines: what the engine reads where it reads text."""
    return "\n".join(p.text for p in parts if isinstance(p, TextPart) and p.text)


def has_media(parts: Sequence[Part]) -> bool:
    """Whether any part is more than text."""
    return any(not isinstance(p, TextPart) for p in parts)


# -- parsing OpenAI's content parts ----------------------------------------------------------

_OPENAI_TYPES = "'text', 'image_url', 'input_audio' or 'file'"


def parse_parts(content: Sequence[Any], where: str = "content") -> Tuple[Part, ...]:
    """A list of OpenAI content parts (dicts, or part records) as records; ``where`` names it in errors."""
    return tuple(parse_part(raw, f"{where}[{i}]") for i, raw in enumerate(content))


def parse_part(raw: Any, where: str = "part") -> Part:
    """One OpenAI content part as a record; a :class:`ConfigError` names what is wrong and where."""
    if isinstance(raw, PART_TYPES):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a content part such as {{'type': 'text', 'text': '...'}}, "
                          f"got {type(raw).__name__}")
    kind = raw.get("type")
    try:
        if kind == "text":
            return TextPart(_field(raw, "text", where))
        if kind == "image_url":
            image = _object(raw, "image_url", where)
            return ImagePart(_field(image, "url", f"{where}.image_url"), _optional(image, "detail", where))
        if kind == "input_audio":
            audio = _object(raw, "input_audio", where)
            return AudioPart(_field(audio, "data", f"{where}.input_audio"),
                             _field(audio, "format", f"{where}.input_audio"))
        if kind == "file":
            file = _object(raw, "file", where)
            return FilePart(_optional(file, "file_data", where), _optional(file, "file_id", where),
                            _optional(file, "filename", where), _optional(file, "file_url", where))
    except ConfigError as exc:
        if str(exc).startswith(where):
            raise
        raise ConfigError(f"{where}: {exc}") from exc
    raise ConfigError(f"{where} has type {kind!r}; a content part is one of {_OPENAI_TYPES}")


def _object(raw: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}.{key} must be an object, e.g. {_EXAMPLES[key]}")
    return value


def _field(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def _optional(raw: Mapping[str, Any], key: str, where: str) -> Optional[str]:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {type(value).__name__}")
    return value


_EXAMPLES = {
    "image_url": "{'type': 'image_url', 'image_url': {'url': 'https://... or data:image/png;base64,...'}}",
    "input_audio": "{'type': 'input_audio', 'input_audio': {'data': '<base64>', 'format': 'wav'}}",
    "file": "{'type': 'file', 'file': {'file_data': 'data:application/pdf;base64,...', 'filename': 'a.pdf'}}",
}
