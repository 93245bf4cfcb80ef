"""A tiny raw-socket HTTP server on 127.0.0.1 for byte-exact misbehaviour.

FakeProvider speaks HTTP correctly and misbehaves on purpose in a few
scripted ways; this one speaks whatever bytes a test writes, so a test can
send headers and then nothing, trickle one byte at a time, cut a chunked or
close-delimited body in the middle of a JSON object, or declare a length it
never sends.  Each connection runs ``script(conn)`` in its own thread;
:class:`RawConn` gives the script what it needs and notices when the client
goes away (``peer_closed``), which is how the tests see that a timeout or a
cancel really shut the socket down.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from typing import Callable, List

GUARD_S = 10.0  # a failure guard, never a speed assertion

STREAM_HEADERS_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n")
STREAM_HEADERS_CLOSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Connection: close\r\n\r\n")


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk holding ``data``."""
    return b"%X\r\n%s\r\n" % (len(data), data)


class RawConn:
    """One accepted connection, as a script sees it."""

    def __init__(self, sock: socket.socket, server: RawServer) -> None:
        self.sock = sock
        self.server = server
        self.request = b""
        self.peer_closed = threading.Event()

    def read_request(self) -> bytes:
        """Read one HTTP request (headers plus a Content-Length body) and return it whole."""
        data = b""
        while b"\r\n\r\n" not in data:
            part = self.sock.recv(65536)
            if not part:
                self.peer_closed.set()
                return data
            data += part
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            part = self.sock.recv(65536)
            if not part:
                break
            body += part
        self.request = head + b"\r\n\r\n" + body
        self.server.requests.append(self.request)
        self.server.request_seen.set()
        return self.request

    def send(self, data: bytes) -> bool:
        """Write ``data``; False once the client has gone away."""
        if self.gone():
            return False
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self._mark_closed()
            return False

    def gone(self) -> bool:
        """True once the client closed or shut down its end (a readable socket that reads empty)."""
        if self.peer_closed.is_set():
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if readable and self.sock.recv(65536, socket.MSG_PEEK) == b"":
                self._mark_closed()
        except (OSError, ValueError):
            self._mark_closed()
        return self.peer_closed.is_set()

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds``, watching for the client to leave; False if it did (or the server closes)."""
        deadline = time.monotonic() + seconds
        while True:
            if self.gone() or self.server.closing.is_set():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self.server.closing.wait(min(left, 0.01))

    def wait_gone(self, timeout: float = GUARD_S) -> bool:
        """Send nothing; return True when the client goes away, False at the guard or on server close."""
        return not self.pause(timeout) and self.peer_closed.is_set()

    def _mark_closed(self) -> None:
        if not self.peer_closed.is_set():
            self.peer_closed.set()
            self.server.peer_closed.set()


Script = Callable[[RawConn], None]


class RawServer:
    """Runs ``script(conn)`` for every connection; ``close()`` ends them all and joins the threads."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.closing = threading.Event()
        self.peer_closed = threading.Event()  # set when any client left before its script ended
        self.request_seen = threading.Event()
        self.script_done = threading.Event()
        self.requests: List[bytes] = []
        self.errors: List[BaseException] = []
        self.conns: List[RawConn] = []
        self._threads: List[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name=f"RawServer-{self.port}", daemon=True)
        self._accept.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                readable, _, _ = select.select([self.listener], [], [], 0.02)
            except (OSError, ValueError):
                return
            if not readable:
                continue
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = RawConn(sock, self)
            self.conns.append(conn)
            thread = threading.Thread(target=self._run, args=(conn,), name=f"RawServer-{self.port}-conn",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, conn: RawConn) -> None:
        try:
            self.script(conn)
        except OSError:
            conn._mark_closed()
        except BaseException as exc:  # a broken script must fail the test, not vanish
            self.errors.append(exc)
        finally:
            self.script_done.set()
            try:
                conn.sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self.closing.set()
        self._accept.join(GUARD_S)
        self.listener.close()
        for conn in list(self.conns):
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in list(self._threads):
            thread.join(GUARD_S)
        if self.errors:
            raise AssertionError(f"a RawServer script failed: {self.errors[0]!r}") from self.errors[0]

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FullAcceptQueue:
    """A listener that never accepts, its accept queue filled: new connects hang (SYNs dropped).

    The "provider so overloaded it does not even accept" case.  ``stalls``
    is False where the OS answers such connects anyway (then tests skip).
    """

    def __init__(self) -> None:
        import select

        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.fillers: List[socket.socket] = []
        for _ in range(8):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self.fillers.append(filler)
        time.sleep(0.05)  # let the handshakes that can complete, complete
        probe = self.fillers[-1]
        _, writable, _ = select.select([], [probe], [], 0.2)
        self.stalls = not writable

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        for filler in self.fillers:
            filler.close()
        self.listener.close()

    def __enter__(self) -> FullAcceptQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
