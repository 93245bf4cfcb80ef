# Sourced by scripts/test: Node and the frontend clients for the frontend tests (tests/web/test_frontends*.py).
#
# - Installs Debian's nodejs and npm packages only when node or npm is missing, we are root and
#   apt-get is there (scripts/_apt.sh).
# - Runs `npm ci` in tests/web/frontend (the pinned package.json and its committed lockfile) only
#   when node_modules was not installed from this very lockfile (a stamp holds its checksum).
# - Skipped when STREAMENGINE_TEST_NODE=0.
# - Otherwise says why it could not; the frontend tests then skip, or fail under CI=true.

source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"

_node_note() { echo "scripts/_node.sh: $*" >&2; }

_node_install() {
  local dir="$ROOT/tests/web/frontend" hint="the frontend tests will skip (fail under CI=true)"
  if [ "${STREAMENGINE_TEST_NODE:-1}" = 0 ]; then return 0; fi
  command -v node >/dev/null || _apt_install nodejs _node_note "$hint" || return 0
  command -v npm >/dev/null || _apt_install npm _node_note "$hint" || return 0
  local stamp="$dir/node_modules/.streamengine-lock" want
  want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  _node_note "npm ci in tests/web/frontend (first run, ~1 min)"
  if (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >"$dir/npm-ci.log" 2>&1); then
    echo "$want" >"$stamp"
  else
    _node_note "npm ci failed (see tests/web/frontend/npm-ci.log); $hint"
  fi
}

_node_install
