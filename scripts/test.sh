#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through CTest.
# usage: scripts/test.sh [preset] [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true
bash scripts/build.sh "$preset"
# A bounded fuzz run of every target first (fuzz/, docs/FUZZING.md): PSTRAIN_FUZZ_SECONDS per
# target (default 6: 14 targets, 84 s in all; 0 skips it). CTest's summary stays the last thing
# printed.
fuzz_seconds="${PSTRAIN_FUZZ_SECONDS:-6}"
if ! [[ "$fuzz_seconds" =~ ^[0-9]+$ ]]; then
  echo "test.sh: PSTRAIN_FUZZ_SECONDS must be a whole number of seconds per fuzz target (0 skips" \
       "the fuzz run), got '$fuzz_seconds'" >&2
  exit 2
fi
if [ "$fuzz_seconds" -gt 0 ]; then
  bash scripts/fuzz.sh "$fuzz_seconds"
fi
cd "build/$preset"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
