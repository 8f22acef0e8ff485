#!/usr/bin/env bash
# Builds the Dockerfile's image with podman and runs it as users would: --version, then a local
# 2-host PS job and a 2-rank mpirun allreduce job on datagen data, inside the container.
#
#   bash scripts/container_test.sh [--bootstrap-base] [--tag pstrain:test]
#
# --bootstrap-base: when `debian:12` is not in podman's local storage and no registry is reachable
#   (the development machine reaches Debian's package mirror only), make it with debootstrap from
#   that mirror and import it as docker.io/library/debian:12. The image is then Debian 12 as
#   Debian ships it, not Docker Hub's build of it.
#
# Not part of scripts/test.sh: building the image compiles pstrain from scratch (minutes on
# 2 cores), which CI's time budget does not allow. docs/DEPLOY.md records the last run.
set -euo pipefail
cd "$(dirname "$0")/.."

bootstrap=0
tag=pstrain:test
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bootstrap-base) bootstrap=1; shift ;;
    --tag) tag="$2"; shift 2 ;;
    *) echo "container_test.sh: unknown argument '$1' (expected --bootstrap-base or --tag T)" >&2; exit 2 ;;
  esac
done

sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  sudo_if_needed apt-get install -y -qq --no-install-recommends podman runc >/dev/null
fi

# Sandboxes with hybrid cgroups (v1 and v2 mounted) are refused by crun, podman's default
# runtime; runc accepts them. The rlimits podman asks for by default may exceed the hard limits
# of an unprivileged sandbox, so ask for the ones this shell has.
podman_run_flags=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
podman=(podman --runtime runc)

base=docker.io/library/debian:12
if ! "${podman[@]}" image exists "$base"; then
  if [[ $bootstrap -eq 0 ]]; then
    echo "container_test.sh: $base is not in podman's storage; podman build will pull it" \
         "(pass --bootstrap-base to make it from Debian's mirror instead)" >&2
  else
    command -v debootstrap >/dev/null || sudo_if_needed apt-get install -y -qq debootstrap >/dev/null
    rootfs=$(mktemp -d)
    trap 'sudo_if_needed rm -rf "$rootfs"' EXIT
    echo "container_test.sh: debootstrap bookworm (minbase) -> $base"
    sudo_if_needed debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    sudo_if_needed rm -rf "$rootfs"/var/cache/apt/archives/*.deb
    sudo_if_needed tar -C "$rootfs" -c . | "${podman[@]}" import - "$base" >/dev/null
  fi
fi

echo "container_test.sh: building $tag"
start=$(date +%s)
"${podman[@]}" build "${podman_run_flags[@]}" -t "$tag" . >/tmp/pstrain_container_build.log 2>&1 || {
  tail -30 /tmp/pstrain_container_build.log >&2
  echo "container_test.sh: podman build failed; full log in /tmp/pstrain_container_build.log" >&2
  exit 1
}
echo "container_test.sh: built in $(( $(date +%s) - start )) s; image size" \
     "$("${podman[@]}" image inspect "$tag" --format '{{.Size}}') bytes"

run() { "${podman[@]}" run --rm "${podman_run_flags[@]}" "$@"; }

version=$(run "$tag" --version)
echo "container_test.sh: $version"
[[ "$version" == pstrain\ * ]] || { echo "container_test.sh: --version printed '$version'" >&2; exit 1; }

# A job inside the container, as users run one: the shipped config, datagen data, 2 local hosts,
# then 2 MPI ranks. Each must end with a test AUC; the checks are on what pstrain printed.
out=$(run --entrypoint sh "$tag" -c '
  set -e; cd /tmp
  cfg=/opt/pstrain/share/pstrain/configs/deepfm_criteo.textproto
  pstrain datagen --rows 20000 --seed 1 --format tfrecord --out d/train >/dev/null
  pstrain datagen --rows 5000 --seed 2 --format tfrecord --out d/test >/dev/null
  pstrain local --hosts 2 --config $cfg --train d/train --eval d/test --format tfrecord --model_dir ps 2>&1 | tail -1
  mpirun --allow-run-as-root --oversubscribe -np 2 pstrain allreduce --config $cfg \
      --train d/train --eval d/test --format tfrecord --model_dir ar 2>&1 | tail -1
  test -s ps/summary.json && test -s ar/summary.json && echo SUMMARIES_OK' 2>&1) || true
echo "$out"
grep -q "pstrain local: done: 2 hosts, 20000 examples" <<<"$out" || { echo "container_test.sh: the PS job did not finish" >&2; exit 1; }
grep -q "20000 examples in .*test auc" <<<"$out" || { echo "container_test.sh: the allreduce job did not finish" >&2; exit 1; }
grep -q SUMMARIES_OK <<<"$out" || { echo "container_test.sh: a summary.json is missing" >&2; exit 1; }
echo "container_test.sh: OK"
