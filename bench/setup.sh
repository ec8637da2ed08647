#!/usr/bin/env bash
# bench/setup.sh — install what the benchmark harness needs from Debian 12, if missing:
# python3-matplotlib, python3-numpy (charts, statistics) and fio (the raw-bandwidth probe).
# Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail
need=()
/usr/bin/python3 -c 'import numpy' 2>/dev/null || need+=(python3-numpy)
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
command -v fio >/dev/null 2>&1 || need+=(fio)
if [ ${#need[@]} -eq 0 ]; then
  echo "bench/setup.sh: python3-numpy, python3-matplotlib, fio present"
  exit 0
fi
echo "bench/setup.sh: installing ${need[*]}"
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo_ apt-get update -qq
$sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}"
