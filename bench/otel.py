"""Section 13: what OpenTelemetry instrumentation costs per token, beside the uninstrumented engine.

Three variants, each in a fresh process reading the same streams from a
FakeProvider on 127.0.0.1 (5,000 one-token frames a stream, ten streams a process, a tool
registered so the inline scanner is on):

* ``none``: ``opentelemetry`` cannot be imported (the engine's hooks are ``None``);
* ``api``: the API installed, no SDK configured (non-recording spans);
* ``sdk``: the SDK with a ``BatchSpanProcessor`` (to an exporter that drops
  the batch) and a ``MeterProvider`` with an in-memory reader.

The figure is process CPU time (user + system, all threads) per token; the
variants alternate over the repeats so machine noise spreads evenly.  This is
the engine's own cost; a served stream adds the WSGI server's, which is the
same in every variant, so the served ratios are at most these.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List

from .common import ROOT, median, spread

TOKENS = 5000
VARIANTS = ("none", "api", "sdk")
TARGETS = {"api": 1.02, "sdk": 1.10}

_CHILD = r'''
import json, os, sys, time
variant, tokens, streams = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if variant == "none":
    sys.modules["opentelemetry"] = None
if variant == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
from streamengine.testing import FakeProvider, steps as s

@tool
def lookup(q: str) -> str:
    """Never called: keeps the inline scanner on."""
    return q

with FakeProvider() as fp:
    fp.respond_with(lambda request: [s.text("tok ") for _ in range(tokens)])
    engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [lookup],
                             EngineConfig(models=["m"], tool_mode="inline"))
    engine.complete([{"role": "user", "content": "warm up"}])
    started = time.process_time()
    for _ in range(streams):
        engine.complete([{"role": "user", "content": "q"}])
    cpu = time.process_time() - started
    engine.close()
print(json.dumps({"cpu_us_per_token": cpu / (tokens * streams) * 1e6}))
'''


def _one(variant: str, tokens: int, streams: int) -> float:
    out = subprocess.run([sys.executable, "-c", _CHILD, variant, str(tokens), str(streams)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["cpu_us_per_token"]


def run(repeats: int = 5, tokens: int = TOKENS, streams: int = 10) -> Dict[str, Any]:
    samples: Dict[str, List[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:
            samples[variant].append(_one(variant, tokens, streams))
    base = median(samples["none"])
    ratios = {variant: median(samples[variant]) / base for variant in VARIANTS}
    return {"tokens": tokens * streams, "repeats": repeats,
            "us_per_token": {variant: spread(values) for variant, values in samples.items()},
            "ratio_to_none": {variant: round(ratio, 3) for variant, ratio in ratios.items()},
            "met": {variant: ratios[variant] <= TARGETS[variant] for variant in TARGETS}}


def render(t: Dict[str, Any], verdict: Any) -> List[str]:
    lines = [f"13. OpenTelemetry cost: engine CPU per token, {t['tokens']} tokens a process, "
             f"{t['repeats']} processes each (median)"]
    labels = {"none": "opentelemetry not installed", "api": "API installed, no SDK (non-recording)",
              "sdk": "SDK + BatchSpanProcessor + metrics"}
    for variant in VARIANTS:
        us = t["us_per_token"][variant]["median"]
        ratio = t["ratio_to_none"][variant]
        target = TARGETS.get(variant)
        tail = f"  target <= {target:.2f}x: {verdict(t['met'][variant])}" if target else ""
        lines.append(f"    {labels[variant]:<42} {us:7.1f} us/token  {ratio:5.3f}x{tail}")
    return lines
