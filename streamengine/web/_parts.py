"""Which images, audio and files a web request may bring: the application's :class:`PartsPolicy`.

A request's parts are written by whoever can reach the endpoint, so by
default a request may carry text only (text parts included); anything else
is a 400 that names ``make_wsgi_app(parts=PartsPolicy(...))``.  An
application that wants pictures says which kinds, how large, and whether a
part may point at a URL: a URL a browser sent is fetched by the provider,
and the server must never have something fetched it was not told to, so
only data URLs pass unless ``urls=True``.  A ``file_id`` names a file
stored in the provider account the server pays for, possibly another
user's: a request may never send one.  Your own backend
(``trusted_messages=True``) is trusted with parts as with roles: the
policy does not apply to it (the body cap does).

Sizes are the decoded bytes, counted without decoding
(:attr:`~streamengine._parts.ImagePart.size`).  The POST body cap grows by
what the policy lets in (:meth:`PartsPolicy.body_allowance`), so
``max_body_bytes`` keeps meaning the text of a request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .. import _validation as validation
from .._errors import ConfigError
from .._messages import Message
from .._parts import FilePart, ImagePart, Part

#: Why a request's part was refused, and the field that holds it (``messages[1].content[2]``).
Refusal = Tuple[str, str]

#: The kinds of part a policy may allow (text is always allowed).
MEDIA_KINDS = ("image", "audio", "file")
_MIB = 1024 * 1024
#: What a policy costs the body cap besides the parts' base64: their JSON around the data.
_PART_OVERHEAD = 64 * 1024


@dataclass(frozen=True)
class PartsPolicy:
    """What media a request may carry: ``allow`` (``"image"``, ``"audio"``, ``"file"``), each part at most
    ``max_part_bytes``, all of a request's parts at most ``max_request_bytes`` (decoded bytes), and URLs
    only with ``urls=True`` (by default inline data only: ``data:image/png;base64,...``)."""

    allow: Tuple[str, ...] = ()
    urls: bool = False
    max_part_bytes: int = 5 * _MIB
    max_request_bytes: int = 20 * _MIB

    def __post_init__(self) -> None:
        if isinstance(self.allow, str):
            raise ConfigError(f"PartsPolicy(allow=...) takes a collection of kinds, got the string {self.allow!r}; "
                              f"write allow=({self.allow!r},)")
        allow = tuple(self.allow)
        unknown = [kind for kind in allow if kind not in MEDIA_KINDS]
        if unknown:
            raise ConfigError(f"PartsPolicy(allow=...) takes {', '.join(MEDIA_KINDS)}, got {unknown[0]!r}")
        object.__setattr__(self, "allow", allow)
        if not isinstance(self.urls, bool):
            raise ConfigError(f"PartsPolicy(urls=...) must be True or False, got {self.urls!r}")
        validation.count(self.max_part_bytes, "PartsPolicy.max_part_bytes", minimum=1)
        validation.count(self.max_request_bytes, "PartsPolicy.max_request_bytes", minimum=1)

    def body_allowance(self) -> int:
        """Bytes the POST body may hold beyond ``max_body_bytes`` for the parts this policy lets in (base64)."""
        return 0 if not self.allow else -(-self.max_request_bytes // 3) * 4 + _PART_OVERHEAD

    def refusal(self, messages: Sequence[Message], first_index: int = 0) -> Optional[Refusal]:
        """Why this policy refuses the first part of ``messages`` it refuses, and where; None when all pass.

        ``first_index`` is the position of ``messages[0]`` in the request, so
        the field is named as the request wrote it.  (The caller raises:
        ``web._guard.messages_from_request``.)
        """
        total = 0
        for i, message in enumerate(messages, first_index):
            for j, part in enumerate(message.parts):
                if part.kind == "text":
                    continue
                where = f"messages[{i}].content[{j}]"
                why = self._part_refusal(part, where)
                total += part.size
                if why is None and total > self.max_request_bytes:
                    why = (f"{where}: the request's parts come to more than {self.max_request_bytes} bytes "
                           f"(PartsPolicy.max_request_bytes); send fewer or smaller files")
                if why is not None:
                    return why, where
        return None

    def _part_refusal(self, part: Part, where: str) -> Optional[str]:
        if part.kind not in self.allow:
            allowed = f"it takes {', '.join(self.allow)} parts" if self.allow else "it takes text only"
            wanted = tuple(dict.fromkeys((*self.allow, part.kind)))
            return (f"{where}: this server does not take {part.kind} parts ({allowed}); the application "
                    f"allows them with make_wsgi_app(engine, parts=PartsPolicy(allow={wanted!r}))")
        if isinstance(part, FilePart) and part.file_id is not None:
            return f"{where} names a stored file (file_id), which a request may not do; send the file's data"
        if not self.urls and _by_url(part):
            return (f"{where} points at a URL, and this server sends only data it was given (the provider would "
                    f"fetch the URL); send the {part.kind} itself as a data URL (data:<type>;base64,...), or "
                    f"the application allows URLs with PartsPolicy(urls=True)")
        if part.size > self.max_part_bytes:
            return (f"{where}: the {part.describe()} is over the {self.max_part_bytes}-byte limit for one part "
                    f"(PartsPolicy.max_part_bytes); send a smaller file")
        return None


def _by_url(part: Part) -> bool:
    if isinstance(part, ImagePart):
        return part.inline is None
    return isinstance(part, FilePart) and part.url is not None


def checked_policy(parts: object) -> PartsPolicy:
    """``make_wsgi_app(parts=...)``: a :class:`PartsPolicy`, or None for the default (text only)."""
    if parts is None:
        return PartsPolicy()
    if not isinstance(parts, PartsPolicy):
        raise ConfigError(f"parts must be a PartsPolicy, e.g. PartsPolicy(allow=('image',)), or None for text "
                          f"only; got {type(parts).__name__}")
    return parts


__all__: List[str] = ["PartsPolicy"]
