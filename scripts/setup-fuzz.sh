#!/usr/bin/env bash
# setup-fuzz.sh — the libFuzzer toolchain from Debian 12 (bookworm): clang-14 and
# libclang-rt-14-dev (libFuzzer and the sanitizer runtimes for clang). Installed with apt-get
# only when missing; nothing is upgraded. Env knob (read here): MOESTREAM_SKIP_APT=1 (fail
# instead of installing).
set -euo pipefail
pkgs=(clang-14 libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${MOESTREAM_SKIP_APT:-0}" = 1 ]; then
  echo "setup-fuzz: error: packages missing: ${missing[*]} (MOESTREAM_SKIP_APT=1 set)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "setup-fuzz: installing from Debian 12: ${missing[*]}" >&2
$sudo apt-get install -y --no-install-recommends --no-upgrade "${missing[@]}" >&2 \
  || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends --no-upgrade "${missing[@]}" >&2; } \
  || { echo "setup-fuzz: error: apt-get could not install: ${missing[*]}" >&2; exit 1; }
