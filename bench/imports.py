"""Section 11: what ``import streamengine`` costs a script, beside ``import requests``.

Each statement runs in a fresh interpreter (the only honest way to time an
import: a second import in one process is a dict lookup), alternating with
the others so machine noise spreads evenly; the interpreter's own start
(``python -c pass``) is measured the same way and subtracted.  Figures are
medians in milliseconds; the ratio is to ``import requests`` in this run.
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Any, Dict, List

from .common import median, spread

#: What is timed: the package, the names a script imports first, the web app, and the baseline.
STATEMENTS = {
    "python -c pass": "pass",
    "import requests": "import requests",
    "import streamengine": "import streamengine",
    "from streamengine import StreamingEngine, OpenAICompatibleClient, tool":
        "from streamengine import StreamingEngine, OpenAICompatibleClient, tool",
    "import streamengine.wsgi": "import streamengine.wsgi",
}

#: The issue's budget for ``import streamengine`` on this machine.
BUDGET_MS = 60.0


def _once(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return (time.perf_counter() - started) * 1000.0


def run(repeats: int = 30) -> Dict[str, Any]:
    samples: Dict[str, List[float]] = {label: [] for label in STATEMENTS}
    for _ in range(repeats):
        for label, code in STATEMENTS.items():
            samples[label].append(_once(code))
    start = median(samples["python -c pass"])
    cost = {label: max(0.0, median(values) - start) for label, values in samples.items() if label != "python -c pass"}
    baseline = cost["import requests"] or 1e-9
    return {
        "repeats": repeats, "interpreter_start_ms": round(start, 1),
        "ms": {label: round(value, 1) for label, value in cost.items()},
        "ratio_to_requests": {label: round(value / baseline, 2) for label, value in cost.items()},
        "spread_ms": {label: spread(values) for label, values in samples.items()},
        "budget_ms": BUDGET_MS, "met": cost["import streamengine"] <= BUDGET_MS,
    }


def render(t: Dict[str, Any], verdict: Any) -> List[str]:
    lines = [f"11. import cost (fresh interpreter each time, {t['repeats']} runs, interpreter start "
             f"{t['interpreter_start_ms']:.0f} ms subtracted)"]
    for label, ms in t["ms"].items():
        lines.append(f"    {label:<72} {ms:7.1f} ms  {t['ratio_to_requests'][label]:5.2f}x import requests")
    lines.append(f"    import streamengine <= {t['budget_ms']:.0f} ms: {verdict(t['met'])}")
    return lines
