#!/usr/bin/env bash
# Installs what is missing, then configures and builds pstrain (Release, Ninja).
# usage: scripts/build.sh [preset] [target...]
#   presets: release, debug, asan, tsan (default release); targets: all of them when none is named
#   (scripts/quickstart.sh builds `pstrain` only: 149 of the 375 build steps)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true
# PSTRAIN_DEPS=build installs only what building and running pstrain needs (quickstart.sh).
bash scripts/install_deps.sh "${PSTRAIN_DEPS:-all}"
if [ ! -f "build/$preset/build.ninja" ]; then
  cmake --preset "$preset"
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "build/$preset" -j "$(nproc)" "${targets[@]}"
