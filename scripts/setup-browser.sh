#!/usr/bin/env bash
# setup-browser.sh — what the browser test (tests/browser/) needs, installed when missing:
#   1. Debian 12's chromium (apt package `chromium`, /usr/bin/chromium); no browser download.
#   2. Node.js >= 20 and npm (the machine's; Debian 12's own nodejs is 18, too old for
#      playwright-core: then this stops with a message).
#   3. playwright-core, exactly as pinned in tests/browser/package-lock.json (`npm ci`), into
#      tests/browser/node_modules. It drives the system chromium; it downloads no browser.
# Idempotent and quick when everything is there (make test runs it every time).
# Env knob (read here): MOESTREAM_SKIP_APT=1 (do not apt-get install; fail if missing).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$repo/tests/browser"
die() { echo "setup-browser: error: $*" >&2; exit 1; }
say() { echo "setup-browser: $*" >&2; }

apt_install() {
  [ "${MOESTREAM_SKIP_APT:-0}" = 1 ] && die "missing: $* (MOESTREAM_SKIP_APT=1 set)"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing from Debian 12: $*"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends --no-upgrade "$@" >&2 \
    || { $sudo apt-get update >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends --no-upgrade "$@" >&2; } \
    || die "apt-get could not install: $*"
}

[ -x /usr/bin/chromium ] || apt_install chromium
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "Node.js $(node --version) is too old for playwright-core (needs >= 20)"

"$repo/scripts/npm-ci-locked" "$dir"
