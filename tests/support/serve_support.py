"""``served(app)``: the real ``streamengine.web._serve.serve_app`` (waitress) on 127.0.0.1, in a thread."""
from __future__ import annotations

import contextlib
import io
import queue
import threading
from typing import Iterator

from streamengine.web._serve import serve_app


@contextlib.contextmanager
def served(app, threads: int = 8, **options) -> Iterator[str]:
    stop, urls = threading.Event(), queue.Queue()
    thread = threading.Thread(target=serve_app, args=(app,), name="test-serve-limits", kwargs=dict(
        host="127.0.0.1", port=0, threads=threads, out=io.StringIO(), stop=stop, ready=urls.put, **options))
    thread.start()
    try:
        yield urls.get(timeout=10)
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive()
