"""14. Instructions per served token: the engine app against the relay, counted by callgrind.

CPU time on a shared 2-core machine moves by +-50% from one run to the next
(measured here: the same relay, 31 to 67 us a token in three runs in a row),
more than the 1.2x the served target allows, so sections 6 and 7 cannot
resolve it on their own.  ``valgrind --tool=callgrind`` counts the machine
instructions a process executes: the same code and inputs give the same
count, whatever else the machine does.

What is counted is what section 7's two apps (``bench/served_app.py``) do
for a session, without the WSGI server, which costs both the same: each app
is called as a WSGI application in a fresh process and its response
iterated, against the paced upstream (bench/upstream.py) at 20 tokens a
second, so even under valgrind (~50x slower) every frame is its own read, as
in section 7.  A process that runs 3 sessions minus one that runs 1 (the
same start-up, imports and warm-up) leaves exactly 2 sessions; divided by
their tokens, that is instructions per delivered token with the session's
fixed cost spread over its tokens, for sessions of 2 (the fixed cost), 60
(section 7's) and 300 tokens.  Kernel work (system calls) is not counted:
both apps make the same calls per token (``strace -c``: one ``recv``, one
``poll``; see bench/README.md).
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, List

from .common import ROOT

RATE = 20.0  # tokens per second: slow enough that valgrind's reader still takes one frame per read
SIZES = (2, 60, 300)  # tokens per session: the fixed cost, section 7's session, a long answer
KINDS = ("relay", "engine")
_COLLECTED = re.compile(r"Collected : (\d+)")


def _session(app: Any) -> int:
    body = json.dumps({"messages": [{"role": "user", "content": "go"}]}).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/chat/stream", "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": "application/json", "wsgi.input": io.BytesIO(body), "REMOTE_ADDR": "127.0.0.1",
               "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80", "wsgi.url_scheme": "http",
               "HTTP_HOST": "127.0.0.1", "HTTP_ACCEPT": "text/event-stream", "SERVER_PROTOCOL": "HTTP/1.1",
               "QUERY_STRING": ""}
    tokens = 0
    response = app(environ, lambda status, headers, exc_info=None: None)
    try:
        for data in response:
            tokens += data.count(b'data: "')
    finally:
        close = getattr(response, "close", None)
        if close is not None:
            close()
    return tokens


def _worker() -> None:
    """In the counted process: warm both code paths up, then run ``sessions`` sessions of ``tokens``."""
    import gc

    from . import served_app
    from .common import quiet_logs
    spec = json.loads(sys.argv[1])
    quiet_logs()
    base_url = f"http://127.0.0.1:{spec['port']}/v1"
    make = served_app.make_relay if spec["kind"] == "relay" else served_app.make_engine_app
    warm = make(base_url, "paced:20:200:instructions-warm:1")
    for _ in range(2):
        _session(warm)
    app = make(base_url, f"paced:{spec['tokens']}:{RATE}:instructions:1")
    gc.collect()
    gc.freeze()
    got = sum(_session(app) for _ in range(spec["sessions"]))
    if got != spec["tokens"] * spec["sessions"]:
        raise SystemExit(f"instructions/{spec['kind']}: {got} tokens, expected {spec['tokens'] * spec['sessions']}")


def _count(kind: str, port: int, tokens: int, sessions: int) -> int:
    spec = json.dumps({"kind": kind, "port": port, "tokens": tokens, "sessions": sessions})
    code = f"import sys; sys.path.insert(0, {ROOT!r}); from bench.instructions import _worker; _worker()"
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                          "-c", code, spec], capture_output=True, text=True, check=False, timeout=1200,
                         env=dict(os.environ, PYTHONHASHSEED="0"))
    found = _COLLECTED.search(out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind ({kind}, {tokens} tokens x {sessions}): {out.stderr.strip()[-400:]}")
    return int(found.group(1))


def run(upstream_port: int, sizes: tuple = SIZES) -> Dict[str, Any]:
    if shutil.which("valgrind") is None:
        return {"unavailable": "valgrind is not installed (Debian: apt-get install valgrind)"}
    rows: Dict[str, Dict[str, float]] = {kind: {} for kind in KINDS}
    for tokens in sizes:
        for kind in KINDS:
            one, three = (_count(kind, upstream_port, tokens, n) for n in (1, 3))
            rows[kind][str(tokens)] = (three - one) / (2 * tokens)
    ratios = {size: rows["engine"][size] / rows["relay"][size] for size in rows["engine"]}
    return {"rate": RATE, "sizes": list(sizes), "per_token": rows, "ratio": ratios}


def render(t: Dict[str, Any], verdict: Any) -> List[str]:
    if "unavailable" in t:
        return [f"14. Instructions per served token: not available: {t['unavailable']}"]
    sizes = [str(s) for s in t["sizes"]]
    lines = ["14. Instructions per served token (callgrind: deterministic) - section 7's apps called as WSGI apps "
             f"without a server, the upstream paced at {t['rate']:g} tokens/s (one frame per read); "
             "a session's fixed cost spread over its tokens",
             "   app / tokens per session" + "".join(f"{s:>14}" for s in sizes)]
    for kind in KINDS:
        lines.append(f"   {kind:<25}" + "".join(f"{t['per_token'][kind][s]:>14,.0f}" for s in sizes))
    lines.append("   engine / relay           " + "".join(f"{t['ratio'][s]:>13.2f}x" for s in sizes))
    lines.append("   (2 tokens: the fixed cost of a session; 60: section 7's session; the WSGI server's own work, "
                 "the same for both, is not in these figures)")
    return lines
