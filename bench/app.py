"""The engine's WSGI app under waitress, as ``streamengine serve`` runs it, in its own process.

``python -m bench.app UPSTREAM_BASE_URL MODEL THREADS`` prints ``PORT <n>``
and serves until stdin closes.  The upstream is the pre-rendered bench
server; the one tool sleeps 50 ms.
"""
from __future__ import annotations

import os
import sys
import time


def main() -> None:
    upstream, model, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from waitress.server import create_server

    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    from streamengine.wsgi import make_wsgi_app

    @tool(name="lookup")
    def lookup(query: str) -> str:
        """Looks something up (sleeps 50 ms)."""
        time.sleep(0.05)
        return f"found {query}"

    engine = StreamingEngine(OpenAICompatibleClient(upstream), [lookup],
                             EngineConfig(models=[model], tool_mode="inline", pool_size=64))
    # every session comes from 127.0.0.1: the per-client cap must admit them all, or the burst gets 429s
    app = make_wsgi_app(engine, heartbeat_s=15.0, max_streams=threads, max_streams_per_client=threads)
    server = create_server(app, host="127.0.0.1", port=0, threads=threads, connection_limit=threads + 100,
                           backlog=2048, channel_request_lookahead=1, ident="streamengine-bench")
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # after the installed packages
    from bench.common import announce_and_serve
    announce_and_serve(server.effective_port, server.run)


if __name__ == "__main__":
    main()
