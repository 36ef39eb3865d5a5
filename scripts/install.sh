#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine with Python 3.11 + pip:
# Debian's libegl1 (MuJoCo's software EGL rendering) when missing, torch + torchvision, this repo with all
# extras, then LeRobot 0.4.4 (the server's and the bench's LeRobot support, docs/lerobot.md).
# torch is pinned to 2.14.1 + torchvision 0.29.1: on these machines that spec takes local wheels (a CUDA build
# that runs on the CPU); any other spec downloads gigabytes. lerobot 0.4.4 declares torch<2.11, so it goes in
# with --no-deps beside its runtime dependencies pinned to its own ranges (requirements/). Elsewhere the
# in-range route is plain pip: `pip install "torch<2.11" "torchvision<0.26" -e ".[all,lerobot]"`.
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
PIP=(python3 -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==2.14.1" "torchvision==0.29.1"
"${PIP[@]}" -e ".[all]"
"${PIP[@]}" -r requirements/lerobot-0.4.4-runtime.txt
"${PIP[@]}" --no-deps "lerobot==0.4.4"
