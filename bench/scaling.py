"""4. Scaling: time for 1x, 10x, 100x input; peak memory for 10k vs 1M tokens.

* parser: ``XmlParseState.feed`` over prose with tool blocks and stray ``<``
  (a block every ~1000 characters, fed in tokens of 1 or 20 characters — one
  character at a time is the scanner's worst case); 10k, 100k, 1M tokens.
* engine: ``StreamingEngine.complete`` (xml parser on) over a stream of
  2k, 20k, 200k chunks of 1 or 20 characters, from the loopback server.
* memory: ``tracemalloc`` peak while (a) the parser eats 10k vs 1M tokens and
  (b) the engine streams 10k vs 1M one-character chunks (compact frames).  The
  answer itself must be kept (it is the result), so the figure that has to
  stay flat is ``peak - answer size``.
"""
from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any, Dict, List

from .common import Server, median, seg, sse

UNIT = ("Prices rose 3% while a<b held for most firms; see the table. "
        '<tool name="lookup">{"query": "q3 revenue \\"net\\"", "limit": 5}</tool> '
        "Then the analysts wrote that the outlook 'remains uncertain' & margins thin. ") * 6


def _tokens(total_chars: int, size: int) -> List[str]:
    text = (UNIT * (total_chars // len(UNIT) + 1))[:total_chars]
    return [text[i:i + size] for i in range(0, len(text), size)]


def _parse(tokens: List[str]) -> int:
    from streamengine.inline import XmlParseState
    parser = XmlParseState()
    feed = parser.feed
    for token in tokens:
        feed(token)
    parser.flush()
    return parser.calls_found


def parser_times(repeats: int = 3, base: int = 10_000) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for size in (1, 20):
        row = {}
        for scale in (1, 10, 100):
            tokens = _tokens(base * scale * size, size)
            times = []
            for _ in range(repeats if scale < 100 else max(1, repeats - 1)):
                t0 = time.perf_counter()
                _parse(tokens)
                times.append(time.perf_counter() - t0)
            row[f"{scale}x"] = median(times)
        out[f"{size}char"] = row
    return out


def _compact(text: str) -> str:
    import json
    return sse('{"choices":[{"index":0,"delta":{"content":' + json.dumps(text) + '}}]}')


def _finish() -> str:
    return sse('{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}') + sse("[DONE]")


def _engine(server: Server, model: str):
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool

    @tool(name="lookup")
    def lookup(query: str) -> str:
        """Unused: it only switches the inline parser on."""
        return query

    return StreamingEngine(OpenAICompatibleClient(server.base_url), [lookup],
                           EngineConfig(models=[model], tool_mode="xml", completion_timeout=600.0))


def engine_times(server: Server, repeats: int = 3, base: int = 2_000) -> Dict[str, Any]:
    from .common import content_frame, finish_frames
    out: Dict[str, Any] = {}
    for size in (1, 20):
        token = ("abcdefghijklmnopqrst" if size == 20 else "a")
        row = {}
        for scale in (1, 10, 100):
            n = base * scale
            model = server.script(f"scale-{size}-{n}", [seg(content_frame(token), repeat=n), seg(finish_frames())])
            with _engine(server, model) as engine:
                engine.complete([{"role": "user", "content": "warm"}])
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    result = engine.complete([{"role": "user", "content": "scale"}])
                    times.append(time.perf_counter() - t0)
                    if len(result.answer) != n * size:
                        raise RuntimeError(f"scaling: answer of {len(result.answer)} chars, expected {n * size}")
            row[f"{scale}x"] = median(times)
        out[f"{size}char"] = row
    return out


def _peak(fn: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def memory(server: Server) -> Dict[str, Any]:
    out: Dict[str, Any] = {"parser": {}, "engine": {}}
    for n in (10_000, 1_000_000):
        tokens = ["a"] * n  # one shared string: the list is the input, not the parser's memory
        out["parser"][str(n)] = {"peak_bytes": _peak(lambda: _parse(tokens)) - 0, "answer_bytes": 0}
        del tokens
        model = server.script(f"mem-{n}", [seg(_compact("a"), repeat=n), seg(_finish())])
        with _engine(server, model) as engine:
            box = {}
            peak = _peak(lambda: box.setdefault("r", engine.complete([{"role": "user", "content": "m"}])))
            answer = len(box["r"].answer)
            if answer != n:
                raise RuntimeError(f"memory: answer of {answer} chars, expected {n}")
        out["engine"][str(n)] = {"peak_bytes": peak, "answer_bytes": answer}
    return out


def run(server: Server, repeats: int = 3) -> Dict[str, Any]:
    return {"parser_s": parser_times(repeats), "engine_s": engine_times(server, repeats), "memory": memory(server)}
