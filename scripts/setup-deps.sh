#!/usr/bin/env bash
# setup-deps.sh — assemble moestream's private dependency prefix.
#
# What it does, in order:
#   1. Host build tools and header-only libraries from Debian 12 (bookworm) via apt-get,
#      only when missing: cmake, g++, libgtest-dev, libcli11-dev, nlohmann-json3-dev,
#      libcpp-httplib-dev (+ pkg-config to find it), python3-matplotlib (`moestream replay --plot` and its test). These
#      are ordinary bookworm packages; nothing is upgraded.
#   2. The llama.cpp 0.7.0 / ggml 0.27.0 .debs pinned in deps/debian.lock (Debian sid),
#      plus the runtime they need (glibc 2.43, libstdc++ 16, ...), verified by sha256 and
#      extracted with `dpkg -x` into .deps/prefix. Never installed into /, never touching
#      /etc/apt: sid's glibc would replace the system's.
#
# Where the .debs come from (first that exists):
#   $MOESTREAM_DEBS_DIR            (env; a directory holding the exact files of the lock)
#   <repo>/../shared/debian        (CI and development machines)
#   otherwise apt-get download with a private sources.list and state dir under .deps/apt
#   (MOESTREAM_DEBS_DIR=none forces this path).
#
# Idempotent: a stamp holding the lock file's hash skips work when nothing changed.
# Env knobs (read here): MOESTREAM_DEBS_DIR, MOESTREAM_DEPS_DIR (default <repo>/.deps),
# MOESTREAM_SKIP_APT=1 (do not apt-get install host packages; fail if missing).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lock="$repo/deps/debian.lock"
deps="${MOESTREAM_DEPS_DIR:-$repo/.deps}"
prefix="$deps/prefix"
stamp="$deps/prefix.stamp"

die() { echo "setup-deps: error: $*" >&2; exit 1; }
say() { echo "setup-deps: $*" >&2; }

# ---- 1. host packages (bookworm) -------------------------------------------------------
host_pkgs=(cmake g++ make pkg-config libgtest-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev python3-matplotlib liburing-dev)
missing=()
for p in "${host_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "${MOESTREAM_SKIP_APT:-0}" = 1 ] && die "host packages missing: ${missing[*]} (MOESTREAM_SKIP_APT=1 set)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing host packages from Debian 12: ${missing[*]}"
  $sudo apt-get install -y --no-install-recommends --no-upgrade "${missing[@]}" >&2 \
    || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends --no-upgrade "${missing[@]}" >&2; } \
    || die "apt-get could not install: ${missing[*]}"
fi

# ---- 2. private prefix from the lock ---------------------------------------------------
[ -f "$lock" ] || die "lock file missing: $lock"
lock_hash="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock_hash" ] \
   && [ -e "$prefix/usr/lib/x86_64-linux-gnu/libllama.so.0" ]; then
  exit 0  # up to date
fi

debs_dir=""
if [ "${MOESTREAM_DEBS_DIR:-}" != none ]; then  # "none": always download (tests the apt path)
  for d in "${MOESTREAM_DEBS_DIR:-}" "$repo/../shared/debian"; do
    if [ -n "$d" ] && [ -d "$d" ]; then debs_dir="$(cd "$d" && pwd)"; break; fi
  done
fi

mapfile -t entries < <(grep -vE '^\s*(#|$)' "$lock")
[ ${#entries[@]} -gt 0 ] || die "lock file has no entries: $lock"

fetch_dir="$deps/debs"
mkdir -p "$fetch_dir"

download() {  # download <package> <version> into $fetch_dir with a private apt state
  local pkg="$1" ver="$2" apt="$deps/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" "$apt/etc/apt.conf.d"
  if [ ! -f "$apt/etc/sources.list" ]; then
    # Signed by the Debian archive keys of the host's debian-archive-keyring (bookworm's carries
    # the keys that sign sid too).
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" > "$apt/etc/sources.list"
  fi
  local opts=(-o "Dir::Etc=$apt/etc" -o "Dir::Etc::sourcelist=$apt/etc/sources.list"
              -o "Dir::Etc::sourceparts=-" -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists"
              -o "Dir::State::status=/dev/null" -o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=1"
              -o "APT::Architecture=amd64")
  if [ ! -f "$apt/updated" ]; then
    apt-get "${opts[@]}" update >&2 || die "apt-get update (private sid sources) failed"
    touch "$apt/updated"
  fi
  (cd "$fetch_dir" && apt-get "${opts[@]}" download "$pkg=$ver" >&2) \
    || die "package $pkg=$ver: download failed (not in the archive any more? pin a new version in $lock)"
}

tmp="$deps/prefix.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
for e in "${entries[@]}"; do
  read -r pkg ver sha file <<<"$e"
  [ -n "${file:-}" ] || die "malformed lock line: '$e'"
  src=""
  if [ -n "$debs_dir" ] && [ -f "$debs_dir/$file" ]; then
    src="$debs_dir/$file"
  elif [ -f "$fetch_dir/$file" ]; then
    src="$fetch_dir/$file"
  else
    [ -n "$debs_dir" ] && say "package $pkg: $file not in $debs_dir, downloading"
    download "$pkg" "$ver"
    [ -f "$fetch_dir/$file" ] || die "package $pkg: downloaded, but $file is not what apt-get wrote"
    src="$fetch_dir/$file"
  fi
  got="$(sha256sum "$src" | cut -d' ' -f1)"
  [ "$got" = "$sha" ] || die "package $pkg: sha256 mismatch for $src (expected $sha, got $got)"
  dpkg -x "$src" "$tmp" || die "package $pkg: dpkg -x failed on $src"
done

rm -rf "$prefix"
mv "$tmp" "$prefix"
echo "$lock_hash" > "$stamp"
say "prefix ready: $prefix (${#entries[@]} packages)"
