#!/usr/bin/env bash
# Issue 28's end-to-end targets on a small scale (docs/PERFORMANCE.md "Dynamic tables over ten
# days"): ten days of drifting ids (`pstrain datagen --id_churn`), continuous training one day a
# pass (the same --model_dir, each day's files a new pass), three tables for the 26 categorical
# fields: dynamic with a TTL of `TTL_PASSES` passes, dynamic without eviction, and a fixed hashed
# table of `FIXED_ROWS` rows. Per day: live rows (summary.json dynamic_tables), the process's
# peak RSS (/usr/bin/time), ex/s and the test AUC on that day's test set.
#   scripts/dynamic_days.sh <pstrain binary> <work dir>
# Environment: ROWS (a day's train rows), CARD (--max_cardinality), TTL_PASSES, FIXED_ROWS,
# RUNS (a subset of "ttl no_eviction fixed").
set -euo pipefail
P=${1:?pstrain binary}
W=${2:?work dir}
ROWS=${ROWS:-100000}
CARD=${CARD:-20000}
TTL_PASSES=${TTL_PASSES:-2}
FIXED_ROWS=${FIXED_ROWS:-0}   # 0: the TTL table's day-10 live rows
mkdir -p "$W"
for d in $(seq 0 9); do
  [ -d "$W/day$d" ] || "$P" datagen --rows "$ROWS" --seed $((d + 1)) --teacher_seed 7 \
      --max_cardinality "$CARD" --id_churn 0.2 --day "$d" --out "$W/day$d" > /dev/null
  [ -d "$W/test$d" ] || "$P" datagen --rows $((ROWS / 5)) --seed $((d + 101)) --teacher_seed 7 \
      --max_cardinality "$CARD" --id_churn 0.2 --day "$d" --out "$W/test$d" > /dev/null
done
config() {  # $1: the table's body
  local fields=""
  for i in $(seq 1 26); do fields+="  field { name: \"C$i\" table: \"ids\" }"$'\n'; done
  cat <<CFG
features {
$fields  table { name: "ids" $1 }
}
model { type: DEEPFM embedding_dim: 8 hidden: [ 64, 32 ] }
sparse_optimizer { type: ADAGRAD learning_rate: 0.05 }
train { batch_size: 512 epochs: 1 log_every_steps: 100000 }
threads { towers: 1 intra_op_threads: 2 inter_op_threads: 1 }
checkpoint { incremental_every: 1 }
CFG
}
run() {  # $1: name, $2: table body
  local m="$W/$1"
  rm -rf "$m" && mkdir -p "$m"
  config "$2" > "$m.textproto"
  for d in $(seq 0 9); do
    /usr/bin/time -f "%M" -o "$m/rss$d" "$P" train --config "$m.textproto" \
        --train "$W/day$d/*.tsv" --eval "$W/test$d/*.tsv" --model_dir "$m" > "$m/log$d" 2>&1
    python3 - "$m" "$d" "$1" <<'PY'
import json, sys
m, d, name = sys.argv[1], sys.argv[2], sys.argv[3]
s = json.load(open(f"{m}/summary.json"))
rss = int(open(f"{m}/rss{d}").read().split()[-1]) // 1024
t = s.get("dynamic_tables", {}).get("ids", {})
print(f"{name} day {d}: live_rows {t.get('rows_live', '-')} table_MiB "
      f"{t.get('bytes', 0) / 2**20:.1f} rss_MiB {rss} ex/s {s['examples_per_sec']:.0f} "
      f"test_auc {s['test_auc']:.4f} evicted_ttl {t.get('evicted_ttl', '-')}")
PY
  done
}
RUNS=${RUNS:-ttl no_eviction fixed}
for r in $RUNS; do
  case $r in
    ttl) run ttl "dynamic { ttl_passes: $TTL_PASSES }" ;;
    no_eviction) run no_eviction "dynamic { }" ;;
    fixed)
      if [ "$FIXED_ROWS" = 0 ]; then
        FIXED_ROWS=$(python3 -c "import json; print(json.load(open('$W/ttl/summary.json'))['dynamic_tables']['ids']['rows_live'])")
      fi
      run "fixed$FIXED_ROWS" "rows: $FIXED_ROWS" ;;
  esac
done
