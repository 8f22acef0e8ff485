#!/usr/bin/env bash
# Reproduces docs/PERFORMANCE.md "Quality on synthetic data (teacher model)": generates 2M
# training and 200k test rows with the same planted teacher, trains the main rows of the table
# (DeepFM f32 and bf16 for 1 and 3 epochs, LR, FM, Wide&Deep for 1 epoch) one after another, and
# prints test AUC / logloss next to the teacher's Bayes-optimal ones.
#
# Each run writes OUT/runs/<name>/summary.json (and its log OUT/runs/<name>.log). A 1-epoch
# DeepFM run takes 2-4 minutes on a 2-core VM; the whole script takes 20-30 minutes.
# Not for CI.
#
# usage: scripts/quality.sh [out_dir]   (default out/quality; env ROWS_ONLY="deepfm_f32_e1 lr_e1"
#        runs only the named rows; the data is generated once and reused)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out/quality}"
only="${ROWS_ONLY:-}"

bash scripts/install_deps.sh
[ -f build/release/build.ninja ] || cmake --preset release
cmake --build build/release --target pstrain -j "$(nproc)"
bin=build/release/pstrain

if [ ! -f "$out/data/train/teacher.json" ] || [ ! -f "$out/data/test/teacher.json" ]; then
  "$bin" datagen --rows 2000000 --seed 1 --teacher_seed 1 --files 4 --format criteo_tsv \
    --out "$out/data/train"
  "$bin" datagen --rows 200000 --seed 2 --teacher_seed 1 --files 1 --format criteo_tsv \
    --out "$out/data/test"
fi

# name epochs [--set ...]: one training run from scratch into $out/runs/<name>.
run() {
  local name="$1" epochs="$2"
  shift 2
  if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then return; fi
  echo "== $name: $epochs epoch(s) $*"
  rm -rf "$out/runs/$name"
  mkdir -p "$out/runs"
  "$bin" train --config configs/deepfm_criteo.textproto \
    --train "$out/data/train/part-*" --eval "$out/data/test/part-*" --format criteo_tsv \
    --model_dir "$out/runs/$name" --epochs "$epochs" --set checkpoint.every_seconds=0 \
    --set threads.towers=2 "$@" \
    > "$out/runs/$name.log" 2>&1
  rm -rf "$out/runs/$name"/ckpt-*  # the final checkpoint is not needed here
}

# 2 towers as on the machine the table was measured on, so that the global batch (towers x
# batch_size) and hence the numbers are the same on any machine. 3-epoch runs also evaluate after
# each epoch (3907 steps of 2 x 256 examples) into runs/<name>/metrics.jsonl.
run deepfm_f32_e1 1
run deepfm_f32_e3 3 --set train.eval_every_steps=3907
run deepfm_bf16_e1 1 --set model.precision=BF16
run deepfm_bf16_e3 3 --set model.precision=BF16 --set train.eval_every_steps=3907
run wide_deep_e1 1 --set model.type=WIDE_DEEP
run fm_e1 1 --set model.type=FM
run lr_e1 1 --set model.type=LR --set sparse_optimizer.learning_rate=0.1

python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
t = json.load(open(f"{out}/data/test/teacher.json"))
train_rows = json.load(open(f"{out}/data/train/teacher.json"))["rows"]
print(f"\nBayes-optimal on the test set: AUC {t['bayes_auc']:.4f}, logloss {t['bayes_logloss']:.4f}")
print(f"{'run':<16} {'model':<10} {'prec':<5} {'ep':>2} {'AUC':>7} {'logloss':>8} "
      f"{'AUC gap':>8} {'LL gap':>7} {'ex/s':>7}")
for path in sorted(glob.glob(f"{out}/runs/*/summary.json")):
    s = json.load(open(path))
    name = os.path.basename(os.path.dirname(path))
    epochs = round(s["examples"] / train_rows)
    print(f"{name:<16} {s['model']:<10} {s['precision']:<5} {epochs:>2} {s['test_auc']:7.4f} "
          f"{s['test_logloss']:8.4f} {t['bayes_auc'] - s['test_auc']:8.4f} "
          f"{s['test_logloss'] - t['bayes_logloss']:7.4f} {s['examples_per_sec']:7.0f}")
PY
