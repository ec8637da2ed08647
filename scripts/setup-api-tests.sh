#!/usr/bin/env bash
# setup-api-tests.sh — what the API test (tests/api/) needs, installed when missing: Node.js
# >= 20 with npm (Debian's packages when absent) and the official `openai` npm package (with zod, ajv, ajv-formats) exactly
# as pinned in tests/api/package-lock.json (`npm ci`, into tests/api/node_modules), and Debian's
# python3-pydantic with python3-email-validator (pydantic's own schemas for the structured-output check).
# Idempotent and quick when everything is there (make test runs it every time).
# Env knob (read here): MOESTREAM_SKIP_APT=1 (do not apt-get install; fail if missing).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$repo/tests/api"
die() { echo "setup-api-tests: error: $*" >&2; exit 1; }
say() { echo "setup-api-tests: $*" >&2; }

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  [ "${MOESTREAM_SKIP_APT:-0}" = 1 ] && die "missing: node and npm (MOESTREAM_SKIP_APT=1 set)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing from Debian 12: nodejs npm"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends nodejs npm >&2 \
    || die "apt-get could not install nodejs npm"
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "Node.js $(node --version) is too old for the openai SDK (needs >= 20)"

# pydantic (tests/api/pydantic_models.py): Debian's, for /usr/bin/python3.
if ! /usr/bin/python3 -c 'import pydantic, email_validator' 2>/dev/null; then
  [ "${MOESTREAM_SKIP_APT:-0}" = 1 ] && die "missing: python3-pydantic python3-email-validator (MOESTREAM_SKIP_APT=1 set)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing from Debian 12: python3-pydantic python3-email-validator"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends python3-pydantic \
    python3-email-validator >&2 || die "apt-get could not install python3-pydantic python3-email-validator"
fi

"$repo/scripts/npm-ci-locked" "$dir"
