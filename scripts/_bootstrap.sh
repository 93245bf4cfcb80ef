# Sourced by scripts/test, scripts/check and scripts/demo: make .venv and install the package
# into it once, again only when setup.cfg changes (so a fresh clone just works).
# It says what it is doing on stderr; pip's own output goes to .venv/install.log
# and is shown only if the install fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.streamengine-installed"
LOG="$VENV/install.log"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setting up .venv (first run, ~1 min)..." >&2
  "$PY" -m venv "$VENV"
elif [ ! -f "$STAMP" ] || [ "$ROOT/setup.cfg" -nt "$STAMP" ]; then
  echo "updating .venv (setup.cfg changed)..." >&2
fi
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.cfg" -nt "$STAMP" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >"$LOG" 2>&1 || true
  # The test extra for scripts/test, the check extra (ruff, mypy, stubs) for scripts/check.
  if ! "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test,check]" >>"$LOG" 2>&1; then
    echo "installing streamengine into .venv failed; the end of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  touch "$STAMP"
  echo ".venv ready" >&2
fi
