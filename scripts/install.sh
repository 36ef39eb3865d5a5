#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine with Python 3.11 + pip:
# Debian's libegl1 (MuJoCo's software EGL rendering) when missing, then this repo with all extras.
# torch is pinned to 2.13.0: on these machines that spec takes a local CPU wheel; any other spec
# downloads gigabytes of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1'; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libegl1 >/dev/null
  else
    echo "install.sh: libEGL missing and no apt-get; rendered cameras will be unavailable" >&2
  fi
fi
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0"
python3 -m pip install -q --disable-pip-version-check -e ".[all]"
