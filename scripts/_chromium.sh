# Sourced by scripts/test: Chromium for the browser tests (tests/test_browser.py).
#
# - Installs Debian's chromium package only when it is missing, we are root and
#   apt-get is there (as scripts/_postgres.sh does for PostgreSQL).
# - Skipped when STREAMENGINE_TEST_BROWSER=0.
# - Otherwise says why it could not, and the browser tests then skip, or fail
#   under CI=true.

_browser_note() { echo "scripts/_chromium.sh: $*" >&2; }

_browser_found() {
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
    || command -v google-chrome >/dev/null || command -v google-chrome-stable >/dev/null
}

_browser_install() {
  if [ "${STREAMENGINE_TEST_BROWSER:-1}" = 0 ] || _browser_found; then return 0; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    _browser_note "Chromium is not installed and cannot be installed here (needs root and apt-get); install 'chromium' for the browser tests"
    return 0
  fi
  _browser_note "installing Debian's chromium package (first run, ~1 min)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1) \
    || _browser_note "apt-get install chromium failed; the browser tests will skip (fail under CI=true)"
}

_browser_install
