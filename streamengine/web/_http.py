"""HTTP plumbing shared by the web modules: the refusal exception and JSON responses."""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Sequence, Tuple

StartResponse = Callable[..., Any]
Headers = List[Tuple[str, str]]

JSON_TYPE = "application/json; charset=utf-8"
_REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 415: "Unsupported Media Type",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


def status_line(status: int) -> str:
    return f"{status} {_REASONS[status]}"


class HttpError(Exception):
    """A request refused before streaming; ``str()`` is the JSON ``error`` sent back.

    ``field`` names the part of the request that was wrong (``"messages[2].role"``,
    ``"Host"``), so a client can point at it without parsing the sentence.
    """

    def __init__(self, message: str, status: int = 400, headers: Sequence[Tuple[str, str]] = (),
                 field: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)
        self.field = field

    def payload(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {"error": str(self)}
        if self.field:
            body["field"] = self.field
        return body


def json_response(status: int, payload: Dict[str, Any],
                  headers: Sequence[Tuple[str, str]] = ()) -> Tuple[str, Headers, List[bytes]]:
    body = json.dumps(payload, ensure_ascii=True).encode("ascii")
    return status_line(status), [("Content-Type", JSON_TYPE), ("Content-Length", str(len(body)))] + list(headers), \
        [body]
