#!/usr/bin/env bash
# Daily retraining on drifting synthetic data (docs/PERFORMANCE.md "Daily retraining"): days 1, 2
# and 3 come from one teacher that drifts by --drift a day (pstrain datagen --drift/--day); every
# arm is evaluated on day 3, the day after its last training day:
#   cold   a fresh model trained on day 2 only;
#   warm   day 1, then the same command on day 2 (a new training pass from day 1's parameters
#          and optimizer slots: docs/CONFIG.md "A resume is a resume; new data is a new pass").
#   reset  a fresh model dir warm-started from day 1's model with --reset_optimizer, trained on
#          day 2 (the parameters carry over, the optimizer slots start fresh: docs/CONFIG.md
#          "Warm start from another model dir").
# usage: scripts/daily_retraining.sh [ROWS_PER_DAY] [DRIFT] [OUT_DIR]   (defaults 500000 0.1 out/daily)
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-500000}"
drift="${2:-0.1}"
out="${3:-out/daily}"
p="${PSTRAIN:-build/release/pstrain}"
[ -x "$p" ] || bash scripts/build.sh release
rm -rf "$out"
mkdir -p "$out"
for day in 1 2 3; do
  # Other rows every day (--seed), one drifting teacher (--teacher_seed, --drift, --day).
  "$p" datagen --rows "$rows" --seed "$day" --teacher_seed 7 --drift "$drift" --day "$day" \
    --files 2 --out "$out/day$day" > /dev/null
done
common=(--format criteo_tsv --eval "$out/day3" --set train.log_every_steps=1000000)
run() {  # run NAME DAY [FLAGS...]: trains model NAME on day DAY, its log in NAME-dDAY.log
  local name="$1" day="$2"
  shift 2
  "$p" train --train "$out/day$day" --model_dir "$out/$name" "${common[@]}" "$@" \
    > "$out/$name-d$day.log" 2>&1
}
auc() {  # auc NAME: the final test AUC and logloss of model NAME from its summary.json
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('%.4f %.4f %d' % (s['test_auc'], s['test_logloss'], s['examples']))" "$out/$1/summary.json"
}
run cold 2
run warm 1
echo "warm after day 1:  auc logloss examples = $(auc warm)"
run reset 2 --warm_start_from "$out/warm" --reset_optimizer
grep -q "optimizer slots reset" "$out/reset-d2.log"
run warm 2
grep -q "new training pass" "$out/warm-d2.log"
echo "cold (day 2 only): auc logloss examples = $(auc cold)"
echo "warm (day 1 + 2):  auc logloss examples = $(auc warm)"
echo "reset (warm start, fresh optimizer, day 2): auc logloss examples = $(auc reset)"
echo "bayes on day 3:    $(python3 -c "import json; t=json.load(open('$out/day3/teacher.json')); print('%.4f %.4f' % (t['bayes_auc'], t['bayes_logloss']))")"
