"""Section 15: what a token costs in the frontends' framers, beside the app's own SSE frame.

In one process, no server: each framer's ``token()`` is called for every
token of an answer (4-character tokens, the shape of real ones), and the
time per token is the median over repeats.  Beside the shipped paths, the
obvious ways they replaced, to show what each choice is worth:

* ``dict + json per token``: a ``{"type": "text-delta", ...}`` dict dumped for
  every token, instead of the open part's prefix plus one JSON string escape;
* ``text kept with +=``: AG-UI keeps the open message's text for
  ``MESSAGES_SNAPSHOT``; ``self.text += delta`` on an attribute copies the
  whole text every token (quadratic in the answer), a list joined once
  does not.  The gap grows with the answer, so two lengths are timed.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List

from streamengine.web._agui import AgUiStream, RunInput
from streamengine.web._aisdk import UiMessageStream
from streamengine.web._frames import data_frame, encode_token
from streamengine.web._sse import PublicErrors

from .common import median

TOKEN = "word"
LENGTHS = (2_000, 50_000)


class _PlusEquals:
    """The replaced way of keeping a message's text: one string grown by ``+=`` on an attribute."""

    def __init__(self) -> None:
        self.text = ""

    def token(self, text: str) -> bytes:
        self.text += text
        return encode_token(text)


def _ui() -> Callable[[str], bytes]:
    stream = UiMessageStream(PublicErrors("bench"), "msg-bench", 5)
    stream.opening()
    return stream.token


def _ui_dicts() -> Callable[[str], bytes]:
    def token(text: str) -> bytes:
        return data_frame({"type": "text-delta", "id": "text-1", "delta": text})
    return token


def _agui() -> Callable[[str], bytes]:
    stream = AgUiStream(PublicErrors("bench"), RunInput("t", "r", [], []))
    stream.opening()
    return stream.token


WAYS: Dict[str, Callable[[], Callable[[str], bytes]]] = {
    "SSE token frame (baseline)": lambda: encode_token,
    "UI message stream text-delta": _ui,
    "  the replaced dict + json per token": _ui_dicts,
    "AG-UI TEXT_MESSAGE_CONTENT, text kept in a list": _agui,
    "  the replaced text kept with +=": lambda: _PlusEquals().token,
}


def _per_token_us(make: Callable[[], Callable[[str], bytes]], tokens: int) -> float:
    token = make()
    started = time.perf_counter()
    for _ in range(tokens):
        token(TOKEN)
    return (time.perf_counter() - started) / tokens * 1e6


def run(repeats: int = 5, lengths: Any = LENGTHS) -> Dict[str, Any]:
    us: Dict[str, Dict[str, float]] = {}
    for length in lengths:
        samples: Dict[str, List[float]] = {label: [] for label in WAYS}
        for _ in range(repeats):
            for label, make in WAYS.items():  # interleaved, so machine noise spreads evenly
                samples[label].append(_per_token_us(make, length))
        us[str(length)] = {label: round(median(values), 3) for label, values in samples.items()}
    return {"repeats": repeats, "token": TOKEN, "us_per_token": us}


def render(t: Dict[str, Any], verdict: Any) -> List[str]:
    lengths = list(t["us_per_token"])
    lines = [f"15. a token in the frontends' framers (us a token, median of {t['repeats']}; in-process, no server)",
             f"    {'':<52}" + "".join(f"{length + ' tokens':>16}" for length in lengths)]
    for label in next(iter(t["us_per_token"].values())):
        lines.append(f"    {label:<52}" + "".join(f"{t['us_per_token'][n][label]:16.3f}" for n in lengths))
    return lines
