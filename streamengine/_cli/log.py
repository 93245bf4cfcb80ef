"""The CLI's local log of past runs and the ``streamengine logs`` command that shows it.

The CLI's local log of past runs: ``streamengine logs`` lists them, ``chat -c`` continues the last one.

One SQLite file under the user's data directory
(``$XDG_DATA_HOME/streamengine/logs.db``, else
``~/.local/share/streamengine/logs.db``), as ``llm`` keeps its
``logs.db``: people expect their past prompts to be there.  ``--no-log`` or
``STREAMENGINE_LOG=0`` turns it off.  Each run is one row: the prompt, the
final answer, the model and how the run ended; rows of one conversation
share its ``conversation`` id, so ``-c`` rebuilds the messages in order.
A thinking model's reasoning is kept beside the answer (never sent again by ``-c``).
A log that cannot be written never fails the answer: it is a warning; one
that ``-c`` or ``logs`` cannot read (locked, damaged, in the wrong place) is
one error line saying what to do.  The log holds prompts and answers: it is
created readable by its owner only (0600, in a 0700 directory).

``streamengine logs``: the last runs from the run log above.

At a terminal the logged prompts and answers (model text) are shown with
their control characters visible; into a pipe or file they go as logged.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import stat
import sys
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .._errors import StreamEngineError
from .._logs import for_terminal, is_terminal
from .._messages import StopReason
from .._validation import one_line
from .build import UsageError
from .output import write

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT NOT NULL,
    at REAL NOT NULL,
    model TEXT,
    system TEXT,
    prompt TEXT NOT NULL,
    answer TEXT NOT NULL,
    stop_reason TEXT,
    finish_reason TEXT,
    reasoning TEXT
)
"""
#: Columns added since the first log: a log an older version made gets them as it is opened.
_ADDED_COLUMNS = {"reasoning": "TEXT"}
_OFF = ("0", "false", "no", "off")
#: How long a write by another streamengine may hold the log before reading or writing gives up.
LOCK_WAIT_S = 5.0
_TURN_OFF = "--no-log or STREAMENGINE_LOG=0 turns the log off"


class ConversationLogError(StreamEngineError):
    """The run log cannot be read or written: what is wrong with it, and what to do."""


def log_path(environ: Mapping[str, str]) -> Path:
    """Where the log lives: ``$XDG_DATA_HOME/streamengine/logs.db`` or ``~/.local/share/...``."""
    base = environ.get("XDG_DATA_HOME", "").strip()
    root = Path(base) if base else Path(environ.get("HOME") or Path.home()) / ".local" / "share"
    return root / "streamengine" / "logs.db"


def logging_enabled(environ: Mapping[str, str], no_log_flag: bool) -> bool:
    return not no_log_flag and environ.get("STREAMENGINE_LOG", "").strip().lower() not in _OFF


class RunLog:
    """The log file; every method opens and closes its own connection (one CLI run, few writes).

    Every method raises :class:`ConversationLogError` (never a bare ``sqlite3`` or
    ``OSError``) when the log cannot be used.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def _open(self) -> Iterator[sqlite3.Connection]:
        with self._problems():
            self._make_private()
            with closing(sqlite3.connect(str(self.path), timeout=LOCK_WAIT_S)) as db:
                db.execute(_SCHEMA)
                _add_missing_columns(db)
                yield db

    def _make_private(self) -> None:
        """The directory 0700 and the file 0600, made so or tightened: prompts and answers are private."""
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _tighten(directory, 0o700)
        os.close(os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o600))
        _tighten(self.path, 0o600)

    @contextlib.contextmanager
    def _problems(self) -> Iterator[None]:
        """SQLite's and the OS's errors as one :class:`ConversationLogError` that says what to do."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise ConversationLogError(f"the run log {self.path} is locked by another program "
                                           f"(another streamengine still writing?); try again when it is done "
                                           f"({_TURN_OFF})") from exc
            raise self._cannot_open(exc) from exc
        except sqlite3.DatabaseError as exc:
            raise ConversationLogError(f"the run log {self.path} is damaged ({exc}); move it aside "
                              f"(mv {self.path} {self.path}.broken) and the next run starts a new one") from exc
        except OSError as exc:
            raise self._cannot_open(exc) from exc

    def _cannot_open(self, exc: BaseException) -> ConversationLogError:
        detail = getattr(exc, "strerror", None) or exc
        return ConversationLogError(f"cannot open the run log {self.path} ({detail}): it must be a file in a directory "
                           f"you can write; set XDG_DATA_HOME to move it ({_TURN_OFF})")

    def _present(self) -> bool:
        """Whether there is a log to read; something else in its place is an error, not "no log"."""
        with self._problems():
            for place in (self.path, self.path.parent):
                if place.exists() and not (place.is_file() if place == self.path else place.is_dir()):
                    raise OSError(f"{place} is not a {'file' if place == self.path else 'directory'}")
            return self.path.exists()

    def last_conversation(self) -> Optional[str]:
        """The id of the most recent conversation, or None with an empty (or absent) log."""
        if not self._present():
            return None
        with self._open() as db:
            row = db.execute("SELECT conversation FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def messages(self, conversation: str) -> Tuple[Optional[str], List[Dict[str, str]]]:
        """``(system, messages)`` of a conversation: each run's prompt and answer, in order."""
        with self._open() as db:
            rows = db.execute("SELECT system, prompt, answer FROM runs WHERE conversation = ? ORDER BY id",
                              (conversation,)).fetchall()
        messages: List[Dict[str, str]] = []
        for _, prompt, answer in rows:
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        return (rows[0][0] if rows else None), messages

    def last_model(self, conversation: str) -> Optional[str]:
        """The model that answered the conversation's last run (what ``-c`` asks again without ``-m``)."""
        with self._open() as db:
            row = db.execute("SELECT model FROM runs WHERE conversation = ? AND model IS NOT NULL "
                             "ORDER BY id DESC LIMIT 1", (conversation,)).fetchone()
        return row[0] if row else None

    def record(self, conversation: Optional[str], *, model: Optional[str], system: Optional[str], prompt: str,
               answer: str, stop_reason: Optional[str], finish_reason: Optional[str],
               reasoning: Optional[str] = None) -> str:
        """Add one run; returns its conversation id (a new one when ``conversation`` is None)."""
        conversation = conversation or uuid.uuid4().hex
        with self._open() as db, db:
            db.execute("INSERT INTO runs (conversation, at, model, system, prompt, answer, stop_reason, "
                       "finish_reason, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (conversation, time.time(), model, system, prompt, answer, stop_reason, finish_reason,
                        reasoning))
        return conversation

    def recent(self, count: int) -> List[Dict[str, Any]]:
        """The last ``count`` runs, oldest first."""
        if not self._present():
            return []
        with self._open() as db:
            db.row_factory = sqlite3.Row
            rows = db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (count,)).fetchall()
        return [dict(row) for row in reversed(rows)]


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """Give a log made by an older version the columns it lacks (its rows read NULL there)."""
    present = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in present:
            db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


def _tighten(path: Path, mode: int) -> None:
    """``chmod mode`` when group or others may read ``path`` and it is ours (a log made by an older version)."""
    info = path.stat()
    if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == getattr(os, "getuid", lambda: info.st_uid)():
        os.chmod(path, mode)


def default_log(environ: Optional[Mapping[str, str]] = None) -> RunLog:
    return RunLog(log_path(os.environ if environ is None else environ))


def cmd_logs(args: argparse.Namespace, hooks: Any) -> int:
    out = sys.stdout
    log = default_log()
    if args.path:
        write(out, f"{log.path}\n")
        return 0
    if args.count < 1:
        raise UsageError(f"-n/--count must be at least 1, got {args.count}")
    runs = log.recent(args.count)
    if not runs and not logging_enabled(os.environ, False):
        write(sys.stderr, "the run log is off (STREAMENGINE_LOG=0)\n")
    at_terminal = is_terminal(out)
    shown = for_terminal if at_terminal else (lambda text: text)
    for run in runs:
        if args.json:
            write(out, json.dumps(run, ensure_ascii=at_terminal) + "\n")
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["at"]))
        ended = f", {run['finish_reason']}" if run.get("finish_reason") not in (None, StopReason.STOP) else ""
        thought = f"[reasoning]\n{run['reasoning']}\n[/reasoning]\n\n" if run.get("reasoning") else ""
        write(out, shown(f"## {when}  {run['model'] or '?'}  conversation {run['conversation'][:8]}{ended}\n\n"
                         f"> {one_line(run['prompt'])}\n\n{thought}{run['answer']}\n\n"))
    return 0
