"""``streamengine logs``: the last runs from the run log (see :mod:`.log`).

At a terminal the logged prompts and answers (model text) are shown with
their control characters visible; into a pipe or file they go as logged.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .._terminal import for_terminal, is_terminal
from .._validation import one_line
from .build import UsageError
from .log import default_log, logging_enabled
from .output import write


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
        ended = f", {run['finish_reason']}" if run.get("finish_reason") not in (None, "stop") else ""
        write(out, shown(f"## {when}  {run['model'] or '?'}  conversation {run['conversation'][:8]}{ended}\n\n"
                         f"> {one_line(run['prompt'])}\n\n{run['answer']}\n\n"))
    return 0
