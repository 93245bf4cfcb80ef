# Sourced by scripts/test: Chromium for the browser tests (tests/test_browser.py).
#
# - Installs Debian's chromium package only when it is missing, we are root and
#   apt-get is there (scripts/_apt.sh, shared with scripts/_postgres.sh).
# - Skipped when STREAMENGINE_TEST_BROWSER=0.
# - Otherwise says why it could not, and the browser tests then skip, or fail
#   under CI=true.

source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"

_browser_note() { echo "scripts/_chromium.sh: $*" >&2; }

_browser_found() {
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
    || command -v google-chrome >/dev/null || command -v google-chrome-stable >/dev/null
}

_browser_install() {
  if [ "${STREAMENGINE_TEST_BROWSER:-1}" = 0 ] || _browser_found; then return 0; fi
  _apt_install chromium _browser_note "the browser tests will skip (fail under CI=true)" || true
}

_browser_install
