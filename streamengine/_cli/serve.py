"""``streamengine serve``: the engine as SSE over HTTP, under waitress.

A server has nobody to ask before a side-effect tool runs, so it refuses
every such call unless started with ``--approve all``, which lets every one
run for every client and says so in a WARNING at start.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, List

from .._messages import PROG
from .build import UsageError, build_engine, close_engine, refuse
from .output import write


def approve_all(call: Any) -> bool:
    """``serve --approve all``: every side-effect call runs."""
    return True


def cmd_serve(args: argparse.Namespace, hooks: Any) -> int:
    if args.threads < 1:
        raise UsageError("--threads must be at least 1 (each open stream holds one thread)")
    if args.max_connections_per_client < 0:
        raise UsageError("--max-connections-per-client must be 0 (no cap) or more")
    everything = args.approve == "all"
    engine = build_engine(args, approve=approve_all if everything else refuse)
    try:
        from ..web import make_wsgi_app
        from ..web._serve import serve_app
        _say_what_happens_to_side_effects(engine, everything)
        # Streams beyond threads - 4 get a 429, so health checks and the page always find a thread.
        app = make_wsgi_app(engine, system_prompt=args.system or None, allow_origin=args.allow_origin,
                            heartbeat_s=args.heartbeat, allowed_hosts=args.allowed_host or None,
                            max_streams=max(1, args.threads - 4), expose_errors=args.expose_errors)
        banner = [f"  models {', '.join(engine.config.models)} at {getattr(engine.client, 'base_url', '?')}; "
                  f"tools: {', '.join(engine.registry.names) or 'none'}"
                  + ("; with a system prompt" if args.system else ""),
                  "  POST /v1/chat/stream (SSE), GET /healthz, GET / (a page)"]
        serve_app(app, host=args.host, port=args.port, threads=args.threads, out=sys.stdout, banner=banner,
                  stop=hooks.stop, ready=hooks.ready,
                  max_connections_per_client=args.max_connections_per_client or None)
    finally:
        close_engine(engine)
    return 0


def side_effect_tools(engine: Any) -> List[str]:
    return [name for name in engine.registry.names if getattr(engine.registry.get(name), "side_effects", False)]


def _say_what_happens_to_side_effects(engine: Any, everything: bool) -> None:
    """On stderr at start: which tools are refused, or a WARNING that every call of them runs unasked."""
    names = side_effect_tools(engine)
    if everything:
        which = f" ({', '.join(names)})" if names else " (none registered now)"
        write(sys.stderr, f"{PROG}: WARNING: --approve all: every call of a tool with side effects{which} "
                          f"runs without anyone approving it, for every client of this server\n")
    elif names:
        write(sys.stderr, f"{PROG}: tools with side effects are refused (a server has nobody to ask): "
                          f"{', '.join(names)}; --approve all lets them run\n")
