#!/usr/bin/env bash
# Optional dependencies of the benchmarks (not needed to build, test or train): gnuplot without
# X11, for bench/compare's PNG, from Debian's packages. Idempotent.
set -euo pipefail

if command -v gnuplot >/dev/null 2>&1; then
  echo "install_bench_deps: gnuplot present"
  exit 0
fi
echo "install_bench_deps: installing gnuplot-nox"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends gnuplot-nox
