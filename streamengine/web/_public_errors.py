"""What a client may learn about a failure: a short message and a request id; details go to the log."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Tuple

from .._logs import component_logger
from .._messages import LLM_WARNING
from ._sse import _named_frame, _public_message, done_frame, encode_event, encode_token, tool_result_frame

_log = component_logger("streamengine.web")


class PublicErrors:
    """What a client may learn about failures: a short message and a request id, details to the log.

    Error texts carry provider URLs, status bodies, exception reprs and tool
    tracebacks; none of that belongs in a stranger's browser.  Each detail is
    logged (loguru, ``streamengine`` logger) under ``request_id``, which the
    client sees, so an operator can find it.  ``expose=True`` (development)
    sends the details as well.  Covers ``event: error``, a failed tool's
    ``error``, the engine's visible ``LLM error`` token and the answer in
    ``event: done`` that repeats it, and ``telemetry.failed_attempts`` there
    (only the model and the error's type).
    """

    #: Tokens :meth:`encode` rewrites start with this (the engine's visible warning); the framer
    #: sends any other token as it is, without asking.
    token_prefix = LLM_WARNING

    def __init__(self, request_id: str, *, expose: bool = False, logger: Any = None) -> None:
        self.request_id = request_id
        self.expose = expose
        self._log = logger if logger is not None else _log
        self._warnings: List[Tuple[str, str]] = []  # (warning token as sent by the engine, what the client got)

    def public(self, what: str, detail: Any) -> str:
        """Log ``detail`` under the request id; the text the client gets instead."""
        self._log.warning("request {}: {}: {}", self.request_id, what, detail)
        if self.expose:
            return f"{detail} (request id {self.request_id})"
        return f"{what} (request id {self.request_id}; details are in the server log)"

    def encode(self, event: Any) -> bytes:
        name = getattr(event, "name", None)
        if name == "token":
            text = getattr(event, "text", None)
            if isinstance(text, str) and text.startswith(self.token_prefix):
                return encode_token(self._warning(text))
            return encode_token(text)
        special = self._SPECIAL.get(name) if isinstance(name, str) else None
        return special(self, event) if special is not None else encode_event(event)

    def _warning(self, text: str) -> str:
        shown = LLM_WARNING + self.public("the model request failed", text[len(LLM_WARNING):])
        self._warnings.append((text, shown))
        return shown

    def _error(self, event: Any) -> bytes:
        fatal = getattr(event, "fatal", True)
        what = "the answer failed" if fatal else "a problem the answer went on past"
        message = self.public(what, getattr(event, "message", None))
        return _named_frame(b"event: error\ndata: ", {"message": message, "fatal": fatal,
                                                       "request_id": self.request_id})

    def _tool_result(self, event: Any) -> bytes:
        result = getattr(event, "result", None)
        error = getattr(result, "error", None)
        skipped = getattr(event, "skipped", None)
        if error:
            what = (f"not run ({skipped})" if skipped else
                    "the tool timed out" if getattr(result, "timed_out", False) else "the tool failed")
            error = self.public(f"{what}: {getattr(result, 'name', '?')}", error)
        return tool_result_frame(result, error, skipped)

    def _done(self, event: Any) -> bytes:
        result = getattr(event, "result", None)
        answer = getattr(result, "answer", None)
        if isinstance(answer, str):
            for warning, shown in self._warnings:  # the answer repeats the warning token
                answer = answer.replace(warning, shown)
        telemetry = getattr(result, "telemetry", None)
        failures = getattr(telemetry, "failed_attempts", None)
        if failures and not self.expose:  # which model failed and how, not what its provider said
            telemetry = dataclasses.replace(telemetry, failed_attempts=[
                ": ".join(line.split(": ", 2)[:2]) for line in failures])
        return done_frame(result, answer, telemetry)

    def failure(self, exc: BaseException) -> bytes:
        self._log.opt(exception=exc).error("request {}: event stream failed: {}", self.request_id, exc)
        message = f"{_public_message(exc)} (request id {self.request_id})" if self.expose else \
            f"the answer failed (request id {self.request_id}; details are in the server log)"
        return _named_frame(b"event: error\ndata: ", {"message": message, "request_id": self.request_id})

    _SPECIAL: Dict[str, Callable[[PublicErrors, Any], bytes]] = {
        "error": _error, "tool_result": _tool_result, "done": _done,
    }
