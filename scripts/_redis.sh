# Sourced by scripts/test: a throwaway Redis for the run-log tests (tests/runs/), started on a
# free port of 127.0.0.1 in a temporary directory and stopped on exit.
#
# - Skipped when STREAMENGINE_TEST_REDIS_URL is already set (use your own server)
#   or when STREAMENGINE_TEST_REDIS=0.
# - Installs Debian's redis-server package only when root and missing.
# - No persistence (no RDB, no AOF) and no password: it listens on 127.0.0.1 only and dies with the run.
# - On success exports STREAMENGINE_TEST_REDIS_URL; on failure prints why and leaves it unset
#   (the Redis tests then skip, or fail under CI=true).
# The caller must not `exec` after sourcing this: the EXIT trap stops the server.  scripts/_postgres.sh
# sets its own EXIT trap, so this one chains to whatever trap was there before.

source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"

_redis_note() { echo "scripts/_redis.sh: $*" >&2; }

_redis_free_port() {
  "${PY:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

_redis_stop() {
  if [ -n "${_REDIS_DIR:-}" ] && [ -d "$_REDIS_DIR" ]; then
    local pid tries=50
    pid="$(cat "$_REDIS_DIR/redis.pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
      while [ "$tries" -gt 0 ] && kill -0 "$pid" 2>/dev/null; do tries=$((tries - 1)); sleep 0.1; done
    fi
    rm -rf "$_REDIS_DIR"
  fi
}

_redis_ready() {
  local port="$1" tries=100
  while [ "$tries" -gt 0 ]; do
    if "${PY:-python3}" - "$port" <<'EOF' 2>/dev/null; then return 0; fi
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5) as s:
    s.sendall(b"PING\r\n")
    sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
EOF
    tries=$((tries - 1))
    sleep 0.1
  done
  return 1
}

_redis_start() {
  if ! command -v redis-server >/dev/null; then
    _apt_install redis-server _redis_note "install 'redis-server' or set STREAMENGINE_TEST_REDIS_URL" || return 1
    command -v redis-server >/dev/null || { _redis_note "no redis-server on PATH after installing"; return 1; }
  fi
  _REDIS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/streamengine-redis.XXXXXX")"
  local previous
  previous="$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")"
  # shellcheck disable=SC2064  # the previous trap's text is meant to be expanded now
  trap "_redis_stop; ${previous:-:}" EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local port
  port="$(_redis_free_port)"
  redis-server --bind 127.0.0.1 --port "$port" --dir "$_REDIS_DIR" --save '' --appendonly no \
    --daemonize yes --pidfile "$_REDIS_DIR/redis.pid" --logfile "$_REDIS_DIR/server.log" \
    --maxclients 1000 >/dev/null 2>&1 \
    || { _redis_note "redis-server did not start: $(tail -n 5 "$_REDIS_DIR/server.log" 2>/dev/null)"; return 1; }
  _redis_ready "$port" \
    || { _redis_note "redis-server did not answer PING: $(tail -n 5 "$_REDIS_DIR/server.log" 2>/dev/null)"; return 1; }
  export STREAMENGINE_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
}

if [ -z "${STREAMENGINE_TEST_REDIS_URL:-}" ] && [ "${STREAMENGINE_TEST_REDIS:-1}" != 0 ]; then
  _redis_start || _redis_note "no Redis for the tests: the Redis run-log tests will skip (or fail under CI=true)"
fi
