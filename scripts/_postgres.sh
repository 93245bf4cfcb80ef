# Sourced by scripts/test: a throwaway PostgreSQL cluster for the Postgres RAG
# store tests, started on a free port of 127.0.0.1 and removed on exit.
#
# - Skipped when STREAMENGINE_TEST_PG_DSN is already set (use your own server)
#   or when STREAMENGINE_TEST_PG=0.
# - Installs Debian's postgresql package only when root and missing.
# - initdb refuses to run as root, so as root the cluster belongs to a system
#   user "streamengine-pg" (created when missing).
# - On success exports STREAMENGINE_TEST_PG_DSN; on failure prints why and
#   leaves it unset (the Postgres tests then skip, or fail under CI=true).
# The caller must not `exec` after sourcing this: the EXIT trap stops the server.

source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"

_pg_note() { echo "scripts/_postgres.sh: $*" >&2; }

_pg_bindir() {
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then echo "$dir"; fi
}

_pg_install() {
  _apt_install postgresql _pg_note "install 'postgresql' or set STREAMENGINE_TEST_PG_DSN"
}

_pg_as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u streamengine-pg -- "$@"; else "$@"; fi
}

_pg_free_port() {
  "${PY:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

_pg_stop() {
  if [ -n "${_PG_DIR:-}" ] && [ -d "$_PG_DIR" ]; then
    _pg_as_owner "$_PG_BIN/pg_ctl" -D "$_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$_PG_DIR"
  fi
}

_pg_start() {
  _PG_BIN="$(_pg_bindir)"
  if [ -z "$_PG_BIN" ]; then
    _pg_install || return 1
    _PG_BIN="$(_pg_bindir)"
    [ -n "$_PG_BIN" ] || { _pg_note "no initdb under /usr/lib/postgresql/*/bin after installing"; return 1; }
  fi
  if [ "$(id -u)" = 0 ] && ! id streamengine-pg >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin streamengine-pg \
      || { _pg_note "could not create the system user streamengine-pg (initdb refuses root)"; return 1; }
  fi
  _PG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/streamengine-pg.XXXXXX")"
  trap _pg_stop EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  chmod 700 "$_PG_DIR"
  [ "$(id -u)" = 0 ] && chown streamengine-pg "$_PG_DIR"
  local port
  port="$(_pg_free_port)"
  _pg_as_owner "$_PG_BIN/initdb" -D "$_PG_DIR/data" -U streamengine -A trust -E UTF8 --locale=C.UTF-8 \
    --no-sync >"$_PG_DIR/initdb.log" 2>&1 \
    || { _pg_note "initdb failed: $(tail -n 5 "$_PG_DIR/initdb.log")"; return 1; }
  _pg_as_owner "$_PG_BIN/pg_ctl" -D "$_PG_DIR/data" -l "$_PG_DIR/server.log" -w -t 30 start \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $_PG_DIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" \
    >/dev/null 2>&1 \
    || { _pg_note "the server did not start: $(tail -n 5 "$_PG_DIR/server.log")"; return 1; }
  _pg_as_owner "$_PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U streamengine streamengine_test \
    || { _pg_note "createdb failed"; return 1; }
  export STREAMENGINE_TEST_PG_DSN="postgresql://streamengine@127.0.0.1:$port/streamengine_test"
}

if [ -z "${STREAMENGINE_TEST_PG_DSN:-}" ] && [ "${STREAMENGINE_TEST_PG:-1}" != 0 ]; then
  _pg_start || _pg_note "no PostgreSQL for the tests: the Postgres store tests will skip (or fail under CI=true)"
fi
