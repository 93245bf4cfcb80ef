"""``chat -a PATH|URL`` and ``--at PATH TYPE``: images, audio and files sent with the prompt, as ``llm -a`` does.

A file is read (at most :data:`MAX_ATTACHMENT_BYTES`: a mistyped path to
a disk image must not fill memory) and sent inline as a data URL; a URL is
sent as a URL, for the provider to fetch.  The media type comes from the
name (``mimetypes``) unless ``--at`` gives it; it decides the part:
``image/*`` an image, ``audio/wav`` or ``audio/mpeg`` audio, anything else a
file.  Whether the provider's API can carry the part is the client's to
say, before the request (``Wire.cannot_carry``).
"""
from __future__ import annotations

import argparse
import os
from typing import Any, List, Optional, Sequence, Tuple

from .._errors import ConfigError
from .._parts import AudioPart, FilePart, ImagePart, Part, data_url, guessed_type, is_web_url
from .build import UsageError

#: The largest file ``-a`` reads.
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024
#: Audio media types and the ``input_audio`` format each is sent as.
AUDIO_TYPES = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
               "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def add_attachment_flags(chat: argparse.ArgumentParser) -> None:
    g = chat.add_argument_group("attachments (images, audio, files)")
    g.add_argument("-a", "--attachment", metavar="PATH|URL", dest="attachments", action="append", default=[],
                   type=lambda source: (source, None),
                   help="send a file or URL with the prompt (repeatable); its type is guessed from the name")
    g.add_argument("--at", metavar=("PATH|URL", "TYPE"), dest="attachments", action="append", nargs=2,
                   help="an attachment whose media type you give, e.g. --at scan.bin image/png")


def attachments(args: argparse.Namespace) -> List[Part]:
    """The parts of the ``-a``/``--at`` flags, in the order given; a :class:`UsageError` for one that cannot go."""
    given: Sequence[Any] = getattr(args, "attachments", None) or ()
    return [attachment(source, media_type) for source, media_type in given]


def attachment(source: str, media_type: Optional[str] = None) -> Part:
    """One file or URL as the part its media type calls for."""
    try:
        if is_web_url(source):
            return _by_url(source, _media_type(source, media_type))
        media, data = _read(source, media_type)
        return _inline(source, media, data)
    except ConfigError as exc:
        raise UsageError(f"attachment {source}: {exc}") from exc


def _media_type(source: str, given: Optional[str]) -> str:
    media = (given or guessed_type(source) or "").strip().lower()
    if "/" not in media:
        shown = f"'{given}' is not a media type" if given else "cannot tell its type from the name"
        raise UsageError(f"attachment {source}: {shown}; give it as --at {source} TYPE (e.g. image/png, "
                         f"application/pdf)")
    return media


def _by_url(url: str, media: str) -> Part:
    if media.startswith("image/"):
        return ImagePart(url)
    if media.startswith("audio/"):
        raise UsageError(f"attachment {url}: audio goes inline only; download it and attach the file")
    return FilePart(url=url, filename=os.path.basename(url.split("?", 1)[0]) or None)


def _read(path: str, given: Optional[str]) -> Tuple[str, bytes]:
    media = _media_type(path, given)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_ATTACHMENT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read attachment {path}: {exc.strerror or exc}; check the path") from exc
    if len(data) > MAX_ATTACHMENT_BYTES:
        raise UsageError(f"attachment {path} is larger than {MAX_ATTACHMENT_BYTES} bytes, the most -a sends; "
                         f"send a smaller file, or a URL the provider can fetch")
    return media, data


def _inline(path: str, media: str, data: bytes) -> Part:
    if media.startswith("image/"):
        return ImagePart(data_url(media, data))
    if media.startswith("audio/"):
        audio_format = AUDIO_TYPES.get(media)
        if audio_format is None:
            raise UsageError(f"attachment {path}: {media} audio cannot be sent; providers take WAV or MP3 "
                             f"(convert it)")
        return AudioPart(data_url(media, data).split(",", 1)[1], audio_format)
    return FilePart(data=data_url(media, data), filename=os.path.basename(path))
