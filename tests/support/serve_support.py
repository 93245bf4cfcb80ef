"""``served(engine, **options)``: the public ``streamengine.web.serve`` (waitress) on 127.0.0.1, in a thread."""
from __future__ import annotations

import contextlib
import io
import queue
import threading
from typing import Iterator

from streamengine.web import serve


@contextlib.contextmanager
def served(engine, threads: int = 8, **options) -> Iterator[str]:
    """``serve(engine, ...)`` on a free port until the block ends; yields its URL (ending in ``/``)."""
    stop, urls = threading.Event(), queue.Queue()
    thread = threading.Thread(target=serve, args=(engine,), name="test-serve", kwargs=dict(
        host="127.0.0.1", port=0, threads=threads, out=io.StringIO(), stop=stop, ready=urls.put, **options))
    thread.start()
    try:
        yield urls.get(timeout=10)
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive()
