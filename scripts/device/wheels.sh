#!/usr/bin/env bash
# Downloads the wheels the accelerator machine lacks (scripts/device/packages.txt), built for its Python
# 3.12 on x86-64 Linux and at the versions installed HERE, into .device/wheels (git-ignored): the path
# `run` carries for scripts/device/run.sh. Checks that each wheel's needs are carried or already on that
# machine (device-has.txt) and that the folder stays under the carry budget; prints each wheel and the total.
#
#   scripts/device/wheels.sh [DIR]          DIR defaults to .device/wheels (emptied of old wheels first)
#   WHEELS_LIMIT_MB=60 PYTHON=python3       the size limit; the interpreter whose versions are pinned
#
# docs/benchmarks.md, "Measuring on the accelerator machine".
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.device/wheels}
PY=${PYTHON:-python3}
HERE=scripts/device
mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST"/MANIFEST.txt
pins=$("$PY" "$HERE/device.py" pins "$HERE/packages.txt")
for pin in $pins; do
  # pip matches manylinux_2_N exactly: the tags the machine's glibc accepts, newest first
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "$pin" \
    2> >(grep -v "is neither a file nor a directory" >&2)
done
"$PY" "$HERE/device.py" check-wheels "$DEST" "$HERE/packages.txt" "$HERE/device-has.txt" \
  --limit-mb "${WHEELS_LIMIT_MB:-60}"
echo "wheels.sh: $DEST is ready; carry it: run(command=\"bash scripts/device/run.sh all\", carry=[\"$DEST\"], timeout_s=600)"
