#!/usr/bin/env bash
# Installs pstrain's build and run dependencies from Debian's packages, and nothing else.
# Idempotent: when every package is already present it only runs dpkg-query and exits.
# usage: scripts/install_deps.sh [all|build]
#   all (default): everything the build, the tests, the fuzzers and the scripts use;
#   build: only what configuring, building and running pstrain needs (scripts/quickstart.sh);
#   the test tools (clang, QEMU, Python's NumPy and gRPC, iproute2...) are left out.
set -euo pipefail
group="${1:-all}"
case "$group" in
  all|build) ;;
  *) echo "install_deps.sh: unknown group '$group' (expected all or build)" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libdnnl-dev libeigen3-dev
  # Debian's oneDNN is built with the OpenCL GPU runtime, so its CMake config needs OpenCL's
  # headers and loader to be findable, even though pstrain only uses the CPU engine.
  ocl-icd-opencl-dev opencl-headers
  libopenmpi-dev openmpi-bin
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  # gzip input (worker/data/formats/buffered_io.cc); the Prometheus endpoint (common/metrics/).
  zlib1g-dev prometheus-cpp-dev
  python3
)
TEST_PACKAGES=(
  # python/pstrain_checkpoint.py (NumPy only) and its tests; the gRPC client example of
  # `pstrain serve` (python/serve_client.py: grpcio, and protobuf for the messages protoc writes).
  # Run them with /usr/bin/python3: a python3 earlier in PATH may not see Debian's packages.
  python3-numpy python3-grpcio python3-protobuf
  # Tests: QEMU's user-mode emulator runs the default build on CPU models this machine is not
  # (an AVX2-only AMD Zen 3, a pre-AVX2 Intel); tests/common/emulated_cpu_test.cc.
  qemu-user
  # Fuzzing (fuzz/, scripts/fuzz.sh): clang with libFuzzer and its sanitizers' runtimes; the
  # project's CMake configure with clang needs LLVM's OpenMP.
  clang libclang-rt-14-dev libomp-dev
  # The PS security helper (scripts/make_cluster_certs.sh) and TLS tests; the emulated hosts of
  # scripts/emulate_hosts.sh and the partition test (ip netns, tc; nsenter and prlimit).
  openssl iproute2 util-linux
)

if [ "$group" = all ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
