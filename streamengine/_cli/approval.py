"""Who says yes to a side-effect tool call from the command line: the person at the terminal, a flag, or nobody.

A tool marked ``side_effects=True`` (and an MCP tool whose server's
annotations are not trusted, or that is not read-only) writes somewhere.
The engine runs such a call only when its ``approve`` hook says yes; this
module is that hook for ``chat``:

* ``ask`` (the default when stdin and stderr are terminals): one question
  per call on the terminal, the arguments shown in full and made safe to
  show; only ``y``/``yes`` runs it.  Enter, anything else, Ctrl-C or
  Ctrl-D at the question is a no, and the run goes on;
* ``all`` (``-y``/``--yes``): every call runs;
* ``never`` (the default without a terminal: a pipe, cron, CI): every call
  is refused and the refusal is said on stderr.

A refused call is not run; the model is told so and answers without it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import select
import signal
import threading
from typing import Any, Callable, Iterator, Optional, TextIO

from .._messages import PROG
from .._terminal import for_terminal
from .build import UsageError
from .output import is_terminal, write

APPROVE_MODES = ("ask", "all", "never")
#: What a refusal note says about the way to let such calls run.
_HOW_TO_ALLOW = "-y/--yes lets side-effect tools run"
#: A refusal note shows this much of the call (the question, which decides, shows it all).
_NOTE_CHARS = 200


def add_approval_flags(chat: argparse.ArgumentParser) -> None:
    g = chat.add_argument_group("tools with side effects")
    g.add_argument("--approve", choices=APPROVE_MODES,
                   help="before each call of a tool with side effects: ask at the terminal, run all, or refuse "
                        "(default: ask when stdin and stderr are a terminal, else never)")
    g.add_argument("-y", "--yes", action="store_true", help="run every side-effect tool call without asking "
                                                            "(= --approve all)")


def approval_mode(args: argparse.Namespace, stdin: Any, err: Any) -> str:
    """``ask``, ``all`` or ``never``, from the flags and whether a person can be asked."""
    chosen = getattr(args, "approve", None)
    if getattr(args, "yes", False):
        if chosen not in (None, "all"):
            raise UsageError(f"-y/--yes and --approve {chosen} contradict each other; pass one of them")
        return "all"
    at_terminal = is_terminal(stdin) and is_terminal(err)
    if chosen == "ask" and not at_terminal:
        raise UsageError("--approve ask needs a terminal on stdin and stderr to ask on; without one pass "
                         "-y/--yes to run side-effect tools, or --approve never")
    if chosen is not None:
        return chosen
    return "ask" if at_terminal else "never"


def shown_call(call: Any) -> str:
    """``NAME {arguments}`` in full, one line, every control character visible (never obeyed)."""
    try:
        arguments = json.dumps(json.loads(call.arguments or "{}"), ensure_ascii=False)
    except (ValueError, RecursionError):  # shown as the model wrote them
        arguments = call.arguments
    return for_terminal(f"{call.name} {arguments}")


class Approval:
    """The engine's ``approve`` hook for one ``chat`` command.

    ``before_asking`` (set per answer) ends the printer's current line, so a
    question or a refusal note starts on a line of its own.
    """

    def __init__(self, mode: str, stdin: TextIO, err: TextIO, explicit: bool = False) -> None:
        self.mode, self.stdin, self.err = mode, stdin, err
        self.explicit = explicit  # --approve never was asked for (else: no terminal to ask on)
        self.before_asking: Optional[Callable[[], None]] = None
        self._asking, self._interrupted = threading.Event(), threading.Event()

    @contextlib.contextmanager
    def ctrl_c_answers(self) -> Iterator[None]:
        """While a run goes: Ctrl-C at a question is a no to it, elsewhere it stops the run as before.

        The engine asks on a thread of its own, and only the main thread gets
        the signal: so the main thread's handler ends the question instead.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigint(signum: int, frame: Any) -> None:
            if self._asking.is_set():
                self._interrupted.set()
            else:
                signal.default_int_handler(signum, frame)

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def __call__(self, call: Any) -> bool:
        if self.mode == "all":
            return True
        if self.before_asking is not None:
            self.before_asking()
        if self.mode == "ask":
            return self._ask(call)
        why = "--approve never" if self.explicit else "no terminal to ask on"
        shown = shown_call(call)
        shown = shown if len(shown) <= _NOTE_CHARS else shown[:_NOTE_CHARS - 3] + "..."
        write(self.err, f"{PROG}: refused {shown}: it has side effects ({why}); {_HOW_TO_ALLOW}\n")
        return False

    def _ask(self, call: Any) -> bool:
        """One question; a yes only from ``y``/``yes``.  Ctrl-C or Ctrl-D here is a no, not the end of the run."""
        self._interrupted.clear()
        self._asking.set()  # before the question shows: a Ctrl-C typed at it is its answer
        try:
            write(self.err, f"run {shown_call(call)}? [y/N] ")
            answer = self._typed_line()
        except KeyboardInterrupt:
            answer = None
        finally:
            self._asking.clear()
        if answer is None:  # Ctrl-C: the terminal echoed ^C; the run goes on without the call
            write(self.err, "\n")
            return False
        if not answer:  # end of input
            write(self.err, "\n")
            return False
        return answer.strip().lower() in ("y", "yes")

    def _typed_line(self) -> Optional[str]:
        """The line typed; None once Ctrl-C came (:meth:`ctrl_c_answers`), looked at every 50 ms."""
        while not self._interrupted.is_set():
            if select.select([self.stdin], [], [], 0.05)[0]:
                return self.stdin.readline()
        return None


def approval_for(args: argparse.Namespace, stdin: TextIO, err: TextIO) -> Approval:
    return Approval(approval_mode(args, stdin, err), stdin, err, explicit=getattr(args, "approve", None) == "never")
