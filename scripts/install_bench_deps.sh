#!/usr/bin/env bash
# Optional dependencies of the benchmarks (not needed to build, test or train), from Debian's
# packages. Idempotent.
#   (default)  gnuplot without X11, for bench/compare's PNG
#   --torch    also python3-torch (PyTorch 1.13), for the peer reference bench/pytorch_deepfm.py
#              (run it with /usr/bin/python3: a pyenv python does not see Debian's packages), and
#              OpenBLAS: Debian's torch calls the system BLAS, which is otherwise the netlib
#              reference one (measured 4 GFLOP/s on DeepFM's GEMM; OpenBLAS 50-110)
set -euo pipefail

want=(gnuplot-nox)
if [ "${1:-}" = "--torch" ]; then want+=(python3-torch python3-numpy libopenblas0-pthread); fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_bench_deps: ${want[*]} present"
  exit 0
fi
echo "install_bench_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
