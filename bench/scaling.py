"""4. Scaling: CPU time for 1x, 10x, 100x input; peak memory for 10k vs 1M tokens.

* parser: ``InlineToolScanner.feed`` over prose with tool blocks and stray ``<``
  (a block every ~250 characters, fed in tokens of 1 or 20 characters — one
  character at a time is the scanner's worst case); 5k, 50k, 500k tokens.
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
    """About ``total_chars`` of text (whole UNITs, so copies join cleanly) in ``size``-char tokens."""
    text = UNIT * max(1, round(total_chars / len(UNIT)))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _parse(tokens: List[str], copies: int = 1) -> int:
    """Feed ``tokens`` ``copies`` times as one stream.

    Repeating one list (rather than building a 100x list) keeps the input's own
    memory out of the figure: 1M distinct token strings do not fit in a CPU
    cache, a stream's tokens arrive one at a time.
    """
    from streamengine._inline import InlineToolScanner
    parser = InlineToolScanner()
    feed = parser.feed
    for _ in range(copies):
        for token in tokens:
            feed(token)
    parser.flush()
    return parser.calls_found


def _cpu(fn: Any) -> float:
    """CPU seconds of this process (all its threads) while ``fn`` runs.

    CPU time, not wall time: a scaling ratio must not move when another
    process on the machine takes a core for a moment.
    """
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def parser_times(repeats: int = 5, base: int = 5_000) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    _parse(_tokens(1000, 1))  # warm-up: imports, regex caches
    for size in (1, 20):
        tokens = _tokens(base * size, size)
        times: Dict[int, List[float]] = {1: [], 10: [], 100: []}
        for rep in range(repeats):  # scales interleaved: a slow moment hits all of them
            for scale in (1, 10, 100):
                if scale == 100 and rep >= max(1, repeats - 2):
                    continue
                times[scale].append(_cpu(lambda tokens=tokens, scale=scale: _parse(tokens, scale)))
        out[f"{size}char"] = dict({f"{k}x": median(v) for k, v in times.items()}, tokens_1x=len(tokens))
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
                           EngineConfig(models=[model], tool_mode="inline", completion_timeout=600.0,
                                        # 100x of 20-char tokens is a 4M-char answer: above the default caps
                                        max_answer_chars=10_000_000, max_run_output_chars=10_000_000))


def engine_times(server: Server, repeats: int = 9, base: int = 2_000) -> Dict[str, Any]:
    """CPU seconds of ``StreamingEngine.complete`` (all its threads), scales interleaved.

    Three threads share the GIL, so one run's cost per chunk varies by about
    10% (and more when another process takes a core).  Inputs stay small
    enough (100x = 200k chunks, ~1.3 s) for 9 repeats of every scale.
    """
    from .common import content_frame, finish_frames
    out: Dict[str, Any] = {}
    messages = [{"role": "user", "content": "scale"}]
    for size in (1, 20):
        token = ("abcdefghijklmnopqrst" if size == 20 else "a")
        engines = {}
        try:
            for scale in (1, 10, 100):
                n = base * scale
                model = server.script(f"scale-{size}-{n}", [seg(content_frame(token), repeat=n), seg(finish_frames())])
                engines[scale] = _engine(server, model)
                engines[scale].complete(messages)  # warm-up
            times: Dict[int, List[float]] = {1: [], 10: [], 100: []}
            for _ in range(repeats):
                for scale, engine in engines.items():
                    box: Dict[str, Any] = {}
                    def run(box: Dict[str, Any] = box, engine: Any = engine) -> None:
                        box["r"] = engine.complete(messages)
                    times[scale].append(_cpu(run))
                    if len(box["r"].answer) != base * scale * size:
                        raise RuntimeError(f"scaling: answer of {len(box['r'].answer)} chars, "
                                           f"expected {base * scale * size}")
        finally:
            for engine in engines.values():
                engine.close()
        out[f"{size}char"] = {f"{k}x": median(v) for k, v in times.items()}
    return out


def _peak(fn: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def memory(server: Server, big: int = 1_000_000) -> Dict[str, Any]:
    """Peak traced memory for 10k and 1M tokens; the input itself is built before tracing."""
    out: Dict[str, Any] = {"parser": {}, "engine": {}, "sizes": [10_000, big]}
    # Prose with tool blocks, one character a token (the scanner's worst case),
    # fed n/10k times over: n tokens in all.
    tokens = _tokens(10_000, 1)
    _parse(tokens)  # imports and first-call caches stay out of the figures
    for n in (10_000, big):
        copies = max(1, round(n / len(tokens)))
        out["parser"][str(n)] = {"peak_bytes": _peak(lambda copies=copies: _parse(tokens, copies)), "answer_bytes": 0}
        model = server.script(f"mem-{n}", [seg(_compact("a"), repeat=n), seg(_finish())])
        with _engine(server, model) as engine:
            engine.complete([{"role": "user", "content": "warm"}])
            box = {}
            ask = [{"role": "user", "content": "m"}]
            peak = _peak(lambda box=box, engine=engine, ask=ask: box.setdefault("r", engine.complete(ask)))
            answer = len(box.pop("r").answer)
            if answer != n:
                raise RuntimeError(f"memory: answer of {answer} chars, expected {n}")
        out["engine"][str(n)] = {"peak_bytes": peak, "answer_bytes": answer}
    lo, hi = out["engine"]["10000"], out["engine"][str(big)]
    out["engine_peak_per_answer_byte"] = ((hi["peak_bytes"] - lo["peak_bytes"])
                                          / (hi["answer_bytes"] - lo["answer_bytes"]))
    return out


def run(server: Server, repeats: int = 5, quick: bool = False) -> Dict[str, Any]:
    return {"parser_s": parser_times(1 if quick else repeats, base=500 if quick else 5_000),
            "parser_base_tokens": 500 if quick else 5_000,
            "engine_s": engine_times(server, 1 if quick else 9, base=200 if quick else 2_000),
            "engine_base_chunks": 200 if quick else 2_000,
            "memory": memory(server, big=50_000 if quick else 1_000_000)}
