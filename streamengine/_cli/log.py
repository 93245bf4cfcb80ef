"""The CLI's local log of past runs: ``streamengine logs`` lists them, ``chat -c`` continues the last one.

One SQLite file under the user's data directory
(``$XDG_DATA_HOME/streamengine/logs.db``, else
``~/.local/share/streamengine/logs.db``), as ``llm`` keeps its
``logs.db``: people expect their past prompts to be there.  ``--no-log`` or
``STREAMENGINE_LOG=0`` turns it off.  Each run is one row: the prompt, the
final answer, the model and how the run ended; rows of one conversation
share its ``conversation`` id, so ``-c`` rebuilds the messages in order.
A log that cannot be written never fails the answer: it is a warning.
"""
from __future__ import annotations

import os
import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

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
    finish_reason TEXT
)
"""
_OFF = ("0", "false", "no", "off")


def log_path(environ: Mapping[str, str]) -> Path:
    """Where the log lives: ``$XDG_DATA_HOME/streamengine/logs.db`` or ``~/.local/share/...``."""
    base = environ.get("XDG_DATA_HOME", "").strip()
    root = Path(base) if base else Path(environ.get("HOME") or Path.home()) / ".local" / "share"
    return root / "streamengine" / "logs.db"


def logging_enabled(environ: Mapping[str, str], no_log_flag: bool) -> bool:
    return not no_log_flag and environ.get("STREAMENGINE_LOG", "").strip().lower() not in _OFF


class RunLog:
    """The log file; every method opens and closes its own connection (one CLI run, few writes)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(str(self.path), timeout=5.0)
        connection.execute(_SCHEMA)
        return connection

    def last_conversation(self) -> Optional[str]:
        """The id of the most recent conversation, or None with an empty (or absent) log."""
        if not self.path.exists():
            return None
        with closing(self._connect()) as db:
            row = db.execute("SELECT conversation FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def messages(self, conversation: str) -> Tuple[Optional[str], List[Dict[str, str]]]:
        """``(system, messages)`` of a conversation: each run's prompt and answer, in order."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT system, prompt, answer FROM runs WHERE conversation = ? ORDER BY id",
                              (conversation,)).fetchall()
        messages: List[Dict[str, str]] = []
        for _, prompt, answer in rows:
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        return (rows[0][0] if rows else None), messages

    def record(self, conversation: Optional[str], *, model: Optional[str], system: Optional[str], prompt: str,
               answer: str, stop_reason: Optional[str], finish_reason: Optional[str]) -> str:
        """Add one run; returns its conversation id (a new one when ``conversation`` is None)."""
        conversation = conversation or uuid.uuid4().hex
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO runs (conversation, at, model, system, prompt, answer, stop_reason, "
                       "finish_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (conversation, time.time(), model, system, prompt, answer, stop_reason, finish_reason))
        return conversation

    def recent(self, count: int) -> List[Dict[str, Any]]:
        """The last ``count`` runs, oldest first."""
        if not self.path.exists():
            return []
        with closing(self._connect()) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (count,)).fetchall()
        return [dict(row) for row in reversed(rows)]


def default_log(environ: Optional[Mapping[str, str]] = None) -> RunLog:
    return RunLog(log_path(os.environ if environ is None else environ))
