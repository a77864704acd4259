#!/usr/bin/env bash
# Debian packages the tests use: tcmalloc for vLLM on the CPU, Chromium + its driver for the browser tests.
# Installs what is missing when run as root; otherwise says what to install.
set -euo pipefail
need=()
[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] || [ -e /usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4 ] \
  || need+=(libtcmalloc-minimal4)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]} (run: sudo apt-get install -y ${need[*]})" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed: ${need[*]}"
