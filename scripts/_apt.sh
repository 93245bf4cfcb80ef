# Sourced by scripts/_postgres.sh and scripts/_chromium.sh: install one missing Debian package.
#
# _apt_install PACKAGE NOTE HINT: as root with apt-get, installs PACKAGE (apt-get update runs once per
# scripts/test run, whoever asks first); else, or on failure, says why through the function NOTE,
# with HINT (what to do instead), and returns 1.

_apt_install() {
  local package="$1" note="$2" hint="$3"
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    "$note" "$package is not installed and cannot be installed here (needs root and apt-get); $hint"
    return 1
  fi
  "$note" "installing Debian's $package package (first run, ~1 min)"
  if [ -z "${_APT_UPDATED:-}" ]; then
    apt-get update -qq >/dev/null 2>&1 || { "$note" "apt-get update failed; $hint"; return 1; }
    _APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null 2>&1 \
    || { "$note" "apt-get install $package failed; $hint"; return 1; }
}
