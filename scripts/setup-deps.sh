#!/usr/bin/env bash
# setup-deps.sh [--arch ARCH] — assemble moestream's private dependency prefix.
#
# What it does, in order:
#   1. Host build tools and header-only libraries from Debian 12 (bookworm) via apt-get,
#      only when missing: cmake, g++, libgtest-dev, libcli11-dev, nlohmann-json3-dev,
#      libcpp-httplib-dev (+ pkg-config to find it), python3-matplotlib (`moestream replay --plot` and its test),
#      python3-jinja2 (the reference renderer of the chat-template fidelity test). These
#      are ordinary bookworm packages; nothing is upgraded.
#   2. The llama.cpp 0.7.0 / ggml 0.27.0 .debs pinned in deps/debian.lock (Debian sid) for
#      the architecture being assembled, plus the runtime they need (glibc 2.43, libstdc++ 16,
#      ...), verified by sha256 and extracted with `dpkg -x` into .deps/prefix. Never installed
#      into /, never touching /etc/apt: sid's glibc would replace the system's.
#
# Architecture: the host's (`dpkg --print-architecture`: amd64 or arm64) unless --arch names
# another one. A foreign architecture is a cross build (docs/arm64.md): step 1 installs the
# cross compiler (g++-aarch64-linux-gnu) and qemu-user-static instead of the native build
# packages, the prefix goes to .deps/<arch>/prefix, and the target's copies of the bookworm
# build libraries pinned in deps/cross.lock (liburing, GoogleTest, cpp-httplib, ...) go to
# .deps/<arch>/host. cmake/aarch64-linux-gnu.cmake builds against both.
#
# Where the .debs come from (first that exists):
#   $MOESTREAM_DEBS_DIR            (env; a directory holding the exact files of the lock)
#   <repo>/../shared/debian        (CI and development machines)
#   otherwise apt-get download with a private sources.list, architecture and state dir under
#   .deps/apt (MOESTREAM_DEBS_DIR=none forces this path).
#
# Idempotent: a stamp holding the hash of the lock lines used skips work when nothing changed.
# Env knobs (read here): MOESTREAM_DEBS_DIR, MOESTREAM_DEPS_DIR (default <repo>/.deps; a cross
# build uses its <arch>/ subdirectory), MOESTREAM_SKIP_APT=1 (do not apt-get install host
# packages; fail if missing).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "setup-deps: error: $*" >&2; exit 1; }
say() { echo "setup-deps: $*" >&2; }

arch=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) [ $# -ge 2 ] || die "--arch needs a value (amd64 or arm64)"; arch="$2"; shift 2 ;;
    --arch=*) arch="${1#--arch=}"; shift ;;
    -h|--help) sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (usage: setup-deps.sh [--arch amd64|arm64])" ;;
  esac
done

# Debian architecture of this machine.
host_arch="$(dpkg --print-architecture 2>/dev/null || true)"
if [ -z "$host_arch" ]; then
  case "$(uname -m)" in
    x86_64) host_arch=amd64 ;;
    aarch64|arm64) host_arch=arm64 ;;
    *) host_arch="unknown ($(uname -m))" ;;
  esac
fi
arch="${arch:-$host_arch}"
triplet_of() {
  case "$1" in
    amd64) echo x86_64-linux-gnu ;;
    arm64) echo aarch64-linux-gnu ;;
    *) return 1 ;;
  esac
}
triplet="$(triplet_of "$arch")" \
  || die "architecture '$arch' is not supported (deps/debian.lock pins amd64 and arm64)"

base="${MOESTREAM_DEPS_DIR:-$repo/.deps}"
cross=0
deps="$base"
if [ "$arch" != "$host_arch" ]; then
  cross=1
  deps="$base/$arch"
fi
prefix="$deps/prefix"

# ---- 1. host packages (bookworm) -------------------------------------------------------
if [ "$cross" = 1 ]; then
  # The cross compiler of the target triplet (Debian names it with '-' for '_') and the
  # user-mode emulator that runs the target's binaries here (scripts/arm64-gates.sh).
  host_pkgs=(cmake make pkg-config nlohmann-json3-dev libcli11-dev "g++-${triplet//_/-}" qemu-user-static)
else
  host_pkgs=(cmake g++ make pkg-config libgtest-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev python3-matplotlib python3-jinja2 liburing-dev)
  host_pkgs+=(strace)  # the tests' fault injection into system calls (CacheEnomem.*)
fi
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
debs_dir=""
if [ "${MOESTREAM_DEBS_DIR:-}" != none ]; then  # "none": always download (tests the apt path)
  for d in "${MOESTREAM_DEBS_DIR:-}" "$repo/../shared/debian"; do
    if [ -n "$d" ] && [ -d "$d" ]; then debs_dir="$(cd "$d" && pwd)"; break; fi
  done
fi
fetch_dir="$deps/debs"

download() {  # download <suite> <package> <version> into $fetch_dir with a private apt state
  local suite="$1" pkg="$2" ver="$3" apt="$deps/apt/$1-$arch"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" "$apt/etc/apt.conf.d"
  if [ ! -f "$apt/etc/sources.list" ]; then
    # Signed by the Debian archive keys of the host's debian-archive-keyring (bookworm's carries
    # the keys that sign sid too).
    local s="deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
    case "$suite" in
      sid) echo "$s http://deb.debian.org/debian sid main" ;;
      bookworm) printf '%s\n' "$s http://deb.debian.org/debian bookworm main" \
                  "$s http://deb.debian.org/debian bookworm-updates main" \
                  "$s http://deb.debian.org/debian-security bookworm-security main" ;;
    esac > "$apt/etc/sources.list"
  fi
  local opts=(-o "Dir::Etc=$apt/etc" -o "Dir::Etc::sourcelist=$apt/etc/sources.list"
              -o "Dir::Etc::sourceparts=-" -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists"
              -o "Dir::State::status=/dev/null" -o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=1"
              -o "APT::Architecture=$arch" -o "APT::Architectures=$arch")
  if [ ! -f "$apt/updated" ]; then
    apt-get "${opts[@]}" update >&2 || die "apt-get update (private $suite $arch sources) failed"
    touch "$apt/updated"
  fi
  (cd "$fetch_dir" && apt-get "${opts[@]}" download "$pkg:$arch=$ver" >&2) \
    || die "package $pkg:$arch=$ver: download failed (not in the archive any more? pin a new version in $lock)"
}

# assemble <lock> <suite> <destination> <file that proves it complete>
assemble() {
  local lock="$1" suite="$2" dest="$3" proof="$4" stamp="$3.stamp"
  [ -f "$lock" ] || die "lock file missing: $lock"
  local entries=() e
  while IFS= read -r e; do
    local f=($e)
    [ ${#f[@]} -eq 5 ] || die "malformed line in $lock (want: arch package version sha256 filename): '$e'"
    [ "${f[0]}" = "$arch" ] && entries+=("$e")
  done < <(grep -vE '^\s*(#|$)' "$lock")
  [ ${#entries[@]} -gt 0 ] || die "$lock has no entries for $arch"
  local want
  want="$(printf '%s\n' "$arch" "${entries[@]}" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -e "$dest/$proof" ]; then
    return 0  # up to date
  fi
  mkdir -p "$fetch_dir"
  local tmp="$dest.tmp" a pkg ver sha file src got
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for e in "${entries[@]}"; do
    read -r a pkg ver sha file <<<"$e"
    src=""
    if [ -n "$debs_dir" ] && [ -f "$debs_dir/$file" ]; then
      src="$debs_dir/$file"
    elif [ -f "$fetch_dir/$file" ]; then
      src="$fetch_dir/$file"
    else
      [ -n "$debs_dir" ] && say "package $pkg ($arch): $file not in $debs_dir, downloading"
      download "$suite" "$pkg" "$ver"
      [ -f "$fetch_dir/$file" ] || die "package $pkg: downloaded, but $file is not what apt-get wrote"
      src="$fetch_dir/$file"
    fi
    got="$(sha256sum "$src" | cut -d' ' -f1)"
    [ "$got" = "$sha" ] || die "package $pkg: sha256 mismatch for $src (expected $sha, got $got)"
    dpkg -x "$src" "$tmp" || die "package $pkg: dpkg -x failed on $src"
  done
  [ -e "$tmp/$proof" ] || die "$lock ($arch): $proof missing after extracting ${#entries[@]} packages"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  echo "$want" > "$stamp"
  say "ready: $dest (${#entries[@]} packages, $arch)"
}

mkdir -p "$deps"
assemble "$repo/deps/debian.lock" sid "$prefix" "usr/lib/$triplet/libllama.so.0"
if [ "$cross" = 1 ]; then
  assemble "$repo/deps/cross.lock" bookworm "$deps/host" "usr/lib/$triplet/liburing.a"
fi
