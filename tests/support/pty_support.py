"""The installed command on a pseudo-terminal that is its controlling terminal, as a person's shell runs it.

``Terminal(argv)`` starts ``python -m streamengine ARGV`` in a new
session whose controlling terminal is the pty (so Ctrl-C typed there is a
SIGINT to it, as at a real keyboard), with stdin and stderr on the pty and
stdout on the pty or, with ``stdout_pipe=True``, on a pipe.  ``screen`` is
everything the terminal showed (typed input echoed included).
"""
from __future__ import annotations

import errno
import os
import select
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

#: Becomes the session's controlling terminal (the child is a session leader), then runs the CLI.
_LAUNCH = ("import fcntl, runpy, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
           "sys.argv = ['streamengine'] + sys.argv[1:]; "
           "runpy.run_module('streamengine', run_name='__main__', alter_sys=True)")


class Terminal:
    def __init__(self, argv: List[str], *, env: Dict[str, str], cwd: Optional[str] = None,
                 stdout_pipe: bool = False) -> None:
        self.primary, secondary = os.openpty()
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, *argv], stdin=secondary,
                                         stdout=subprocess.PIPE if stdout_pipe else secondary, stderr=secondary,
                                         env=env, cwd=cwd, start_new_session=True)
        except BaseException:
            os.close(self.primary)
            raise
        finally:
            os.close(secondary)
        self.screen = b""
        self._seen = 0  # wait_for looks past what an earlier wait_for found
        self._closed = False

    def _read(self, timeout: float) -> bool:
        """Read what the terminal shows within ``timeout``; False at its end (the command exited)."""
        ready, _, _ = select.select([self.primary], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.primary, 65536)
        except OSError as exc:
            if exc.errno == errno.EIO:  # every writer closed: the command is gone
                return False
            raise
        self.screen += data
        return bool(data)

    def wait_for(self, needle: bytes, timeout: float = 30.0) -> bytes:
        """Read until ``needle`` shows after what the last wait found; the screen so far (else the test fails)."""
        deadline = time.monotonic() + timeout
        while self.screen.find(needle, self._seen) < 0:
            left = deadline - time.monotonic()
            if (left <= 0 or not self._read(min(left, 0.2))) and self.screen.find(needle, self._seen) < 0:
                raise AssertionError(f"{needle!r} never appeared; the terminal showed {self.screen!r}")
        self._seen = self.screen.find(needle, self._seen) + len(needle)
        return self.screen

    def type(self, keys: bytes) -> None:
        os.write(self.primary, keys)

    def finish(self, timeout: float = 30.0) -> Tuple[int, bytes]:
        """Wait for the command to exit; its status and its stdout (when piped, else b'')."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._read(0.2):
            if self.proc.poll() is not None and not select.select([self.primary], [], [], 0)[0]:
                break
        try:
            status = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the command did not exit; the terminal showed {self.screen!r}") from None
        return status, self.proc.stdout.read() if self.proc.stdout is not None else b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        os.close(self.primary)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def child_env(**extra: str) -> Dict[str, str]:
    """The test's environment without a developer's CLI settings, plus ``extra``."""
    from cli_support import CLI_ENV

    env = {k: v for k, v in os.environ.items() if k not in CLI_ENV}
    env.update(extra)
    return env
