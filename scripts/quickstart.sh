#!/usr/bin/env bash
# The main job on the bundled default: install what is missing, build, generate Criteo-shaped data
# with a planted teacher, train DeepFM on a local 2-host cluster (each host one PS shard + one
# worker, asynchronous push/pull over gRPC on loopback), and print the test AUC next to the
# teacher's Bayes-optimal AUC.
#
# usage: scripts/quickstart.sh [out_dir]
#   env: ROWS, TEST_ROWS, EPOCHS, HOSTS override the sizes; MODE=train runs the single-process
#   trainer instead of the local cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/quickstart}"
rows="${ROWS:-2000000}"
test_rows="${TEST_ROWS:-200000}"
epochs="${EPOCHS:-1}"
hosts="${HOSTS:-2}"
mode="${MODE:-local}"

# The binary only, and only the packages it needs; scripts/test.sh builds and installs the rest.
PSTRAIN_DEPS=build bash scripts/build.sh release pstrain
bin=build/release/pstrain

if [ ! -f "$out/data/train/teacher.json" ] || [ ! -f "$out/data/test/teacher.json" ]; then
  echo "== generating $rows training and $test_rows test rows (same teacher, different seeds)"
  "$bin" datagen --rows "$rows" --seed 1 --teacher_seed 1 --files 4 --format criteo_tsv --out "$out/data/train"
  "$bin" datagen --rows "$test_rows" --seed 2 --teacher_seed 1 --files 1 --format criteo_tsv --out "$out/data/test"
fi

rm -rf "$out/model"
args=(--config configs/deepfm_criteo.textproto
      --train "$out/data/train/part-*" --eval "$out/data/test/part-*" --format criteo_tsv
      --model_dir "$out/model" --epochs "$epochs")
if [ "$mode" = train ]; then
  echo "== training DeepFM in one process ($epochs epoch(s)) into $out/model"
  "$bin" train "${args[@]}"
else
  echo "== training DeepFM on a local $hosts-host PS cluster ($epochs epoch(s)) into $out/model"
  "$bin" local --hosts "$hosts" "${args[@]}"
fi

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/model/summary.json"))
t = json.load(open(f"{out}/data/test/teacher.json"))
print()
print(f"mode          {s['mode']} on {s['hosts']} host(s)")
print(f"test AUC      {s['test_auc']:.4f}   (teacher's Bayes-optimal AUC {t['bayes_auc']:.4f}, gap {t['bayes_auc'] - s['test_auc']:.4f})")
print(f"test logloss  {s['test_logloss']:.4f}   (Bayes-optimal {t['bayes_logloss']:.4f})")
print(f"throughput    {s['examples_per_sec']:.0f} examples/s, {s['examples']} examples in {s['wall_seconds']:.1f} s")
ck = s.get('checkpoint') or 'none'
print(f"checkpoint    {ck}")
print(f"model dir     {out}/model  (summary.json, metrics.jsonl, TensorBoard events)")
PY
