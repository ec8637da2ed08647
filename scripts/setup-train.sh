#!/usr/bin/env bash
# setup-train.sh — what tools/train/ needs (training is done once, by hand; not in CI).
#
#   1. Debian 12 (bookworm) packages via apt-get, only when missing: python3-torch (1.13),
#      python3-numpy, python3-yaml, libopenblas0-pthread (without it Debian's torch uses the
#      reference BLAS: ~7x slower matmuls measured here), linux-doc-6.1 (the corpus).
#   2. The gguf Python package from Debian sid's python3-gguf .deb, pinned in deps/train.lock,
#      fetched with apt-get download through a private sources list and state dir
#      (.deps/apt-sid; /etc/apt is not touched), verified by sha256 and extracted with
#      dpkg -x into .deps/python (never installed into /). tools/train/py sets PYTHONPATH.
#   3. Checks that torch really loads OpenBLAS (its libblas.so.3 in /proc/self/maps) and
#      prints the matmul GFLOPS it gets.
# Idempotent. Env knobs (read here): MOESTREAM_DEPS_DIR (default <repo>/.deps),
#   MOESTREAM_SKIP_APT=1 (fail instead of apt-get install).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${MOESTREAM_DEPS_DIR:-$repo/.deps}"
lock="$repo/deps/train.lock"
die() { echo "setup-train: error: $*" >&2; exit 1; }
say() { echo "setup-train: $*" >&2; }

pkgs=(python3-torch python3-numpy python3-yaml libopenblas0-pthread linux-doc-6.1)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "${MOESTREAM_SKIP_APT:-0}" = 1 ] && die "packages missing: ${missing[*]} (MOESTREAM_SKIP_APT=1 set)"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing from Debian 12: ${missing[*]}"
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends --no-upgrade "${missing[@]}" >&2 \
    || { $sudo apt-get update >&2 && $sudo apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends --no-upgrade "${missing[@]}" >&2; } \
    || die "apt-get could not install: ${missing[*]}"
fi

pydir="$deps/python"
stamp="$pydir.stamp"
lock_hash="$(sha256sum "$lock" | cut -d' ' -f1)"
if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock_hash" ]; }; then
  apt="$deps/apt-sid"
  fetch="$deps/debs"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" \
           "$apt/etc/apt.conf.d" "$fetch"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" \
    > "$apt/etc/sources.list"
  opts=(-o "Dir::Etc=$apt/etc" -o "Dir::Etc::sourcelist=$apt/etc/sources.list"
        -o "Dir::Etc::sourceparts=-" -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists"
        -o "Dir::State::status=/dev/null" -o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=1"
        -o "APT::Architecture=amd64")
  tmp="$pydir.tmp"
  rm -rf "$tmp"; mkdir -p "$tmp"
  while read -r pkg ver sha file; do
    [ -n "${file:-}" ] || die "malformed lock line in $lock"
    if [ ! -f "$fetch/$file" ]; then
      [ -f "$apt/updated" ] || { apt-get "${opts[@]}" update >&2 || die "apt-get update (private sid sources) failed"; touch "$apt/updated"; }
      (cd "$fetch" && apt-get "${opts[@]}" download "$pkg=$ver" >&2) \
        || die "$pkg=$ver: download failed (pin a new version in $lock)"
    fi
    got="$(sha256sum "$fetch/$file" | cut -d' ' -f1)"
    [ "$got" = "$sha" ] || die "$pkg: sha256 mismatch for $fetch/$file (expected $sha, got $got)"
    dpkg -x "$fetch/$file" "$tmp" || die "$pkg: dpkg -x failed"
  done < <(grep -vE '^\s*(#|$)' "$lock")
  rm -rf "$pydir"; mv "$tmp" "$pydir"
  echo "$lock_hash" > "$stamp"
  say "gguf package ready: $pydir/usr/lib/python3/dist-packages"
fi

PYTHONPATH="$pydir/usr/lib/python3/dist-packages" /usr/bin/python3 - <<'PY' || die "python check failed"
import time, torch, gguf
torch.set_num_threads(2)
a = torch.randn(512, 512); b = torch.randn(512, 512); a @ b
t = time.time()
for _ in range(10): a @ b
gf = 2 * 512**3 * 10 / (time.time() - t) / 1e9
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l})
print(f"setup-train: torch {torch.__version__}, gguf {gguf.__file__}, matmul {gf:.1f} GFLOPS, BLAS libs: {libs}")
if not any("openblas" in l for l in libs):
    raise SystemExit("setup-train: torch is not using OpenBLAS")
PY
