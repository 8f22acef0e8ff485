#!/usr/bin/env bash
# Writes the seed corpora of fuzz/ (fuzz/corpus/<target>/) with pstrain itself: a few records in
# every data format (datagen, convert), the files of a small checkpoint (train), the shipped
# configs, and serialized shard requests. Small files only; /work/shared/data is never copied.
# usage: scripts/make_fuzz_corpus.sh [path/to/pstrain]   (default build/release/pstrain)
set -euo pipefail
cd "$(dirname "$0")/.."
PSTRAIN="${1:-build/release/pstrain}"
OUT=fuzz/corpus
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

rm -rf "$OUT"
mkdir -p "$OUT"/{criteo_tsv,csv,libsvm,tfrecord,recordio,checkpoint,config,shard_requests}

# Data: 4 records in each format, one file each, plus a 1-record file.
"$PSTRAIN" datagen --rows 4 --seed 7 --out "$tmp/tsv" > /dev/null 2>&1
cp "$tmp"/tsv/part-*.tsv "$OUT/criteo_tsv/four.tsv"
head -n 1 "$OUT/criteo_tsv/four.tsv" > "$OUT/criteo_tsv/one.tsv"
printf '1\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n' \
  > "$OUT/criteo_tsv/empty_fields.tsv"
# LibSVM cannot hold a missing field (datagen's rows have some): written by hand.
printf '1 0:0.5 17:1 30:0.25\n0 0:1 1:1\n1 3:2 38:1\n' > "$OUT/libsvm/three.libsvm"
for fmt in csv tfrecord recordio; do
  "$PSTRAIN" convert --input "$tmp/tsv/part-00000.tsv" --from criteo_tsv --to "$fmt" --out "$tmp/$fmt" \
    > /dev/null 2>&1
  for f in "$tmp/$fmt"/part-*; do cp "$f" "$OUT/$fmt/four.$fmt"; done
done

# Lists (docs/FORMATS.md "Lists"), for the targets' second spec (fuzz/fuzz_util.h ListSpec:
# I1, C1 a list, C2 a weighted list, C3): by hand, some records bad on purpose, then the good
# ones converted to tfrecord and recordio with that spec.
printf 'label,I1,C1,C2,C3,C2w\n1,5,a1|b2|ff,x;y:2,7a,\n0,,,,1f,\n1,3,1|2|3|4|5|6|7|8|9,a;;b,c,\n0,1,a:zz,x,,\n' \
  > "$OUT/csv/lists.csv"
printf '1 1:0.5 1:5:1 1:6:0.5 2:9:2 7:1\n0 2:1 3:1\n1 1:1 1:1:1 1:2:1 1:3:1 1:4:1 1:5:1 1:6:1 1:7:1 1:8:1 1:9:1 5:1\n0 1:1 0:5:1 5:1\n' \
  > "$OUT/libsvm/lists.libsvm"
cat > "$tmp/lists.textproto" <<'CFG'
features {
  preset: NO_PRESET
  field { name: "I1" kind: NUMERIC }
  field { name: "C1" vocab_size: 1000 list { max_length: 8 overflow: REFUSE } }
  field { name: "C2" share_rows_with: "C3" list { combiner: SQRTN separator: ";" weights_key: "C2w" } }
  field { name: "C3" }
}
CFG
for fmt in tfrecord recordio; do
  "$PSTRAIN" convert --config "$tmp/lists.textproto" --input "$OUT/csv/lists.csv" --from csv \
    --to "$fmt" --max_bad_record_fraction 1 --out "$tmp/lists_$fmt" > /dev/null 2>&1
  for f in "$tmp/lists_$fmt"/part-*; do cp "$f" "$OUT/$fmt/lists.$fmt"; done
done

# A checkpoint of a tiny model: its shard file, worker state and MANIFEST.
cat > "$tmp/tiny.textproto" <<'CFG'
features { categorical_vocab_size: 50 }
model { embedding_dim: 2 hidden: 4 }
train { batch_size: 2 max_steps: 2 }
CFG
"$PSTRAIN" train --config "$tmp/tiny.textproto" --train "$tmp/tsv/part-00000.tsv" \
  --model_dir "$tmp/model" > /dev/null 2>&1
ckpt="$tmp/model/$(tr -d '[:space:]' < "$tmp/model/LATEST")"
cp "$ckpt/shard-0-of-1" "$OUT/checkpoint/shard"
cp "$ckpt/worker-0.state" "$OUT/checkpoint/worker_state"
cp "$ckpt/MANIFEST" "$OUT/checkpoint/manifest"

# Configs: the shipped ones, and overrides.
cp configs/*.textproto "$OUT/config/"
printf 'cluster.lease_ms=5000\n' > "$OUT/config/override_lease"
printf 'data.train[0].shard_policy=SHARD_BY_RECORD\n' > "$OUT/config/override_channel"

# Shard requests: [kind][2-byte length][request] records (fuzz/shard_requests_fuzzer.cc).
python3 - "$OUT/shard_requests" <<'PY'
import struct, sys
out = sys.argv[1]
def varint(n):
    n &= (1 << 64) - 1
    b = b""
    while True:
        x = n & 0x7F
        n >>= 7
        if n:
            b += bytes([x | 0x80])
        else:
            return b + bytes([x])
def field(num, value):
    if isinstance(value, bytes):
        return varint(num << 3 | 2) + varint(len(value)) + value
    return varint(num << 3) + varint(value)
def rec(kind, msg):
    return bytes([kind]) + struct.pack("<H", len(msg)) + msg
ids = struct.pack("<3q", 1, 5, 33)
grads = struct.pack("<9f", *([0.25] * 9))
dense = struct.pack("<5f", *([0.5] * 5))
pull = lambda w, step: field(1, ids) + field(2, 1) + field(3, w) + field(4, step)
push = lambda w, step, seq: (field(1, w) + field(2, 7) + field(3, seq) + field(4, step) +
                             field(5, ids) + field(6, grads) + field(7, dense))
seeds = {
    "sync_steps": rec(1, push(0, 1, 1)) + rec(1, push(1, 1, 1)) + rec(0, pull(0, 2)) +
                  rec(1, push(0, 2, 2)) + rec(0, pull(1, 2)),
    "round": rec(3, field(1, 1) + field(2, 0)) + rec(3, field(1, 2) + field(2, 0) + field(4, 1) +
             field(5, b"state")) + rec(3, field(1, 3) + field(4, 1) + field(6, 2)) +
             rec(4, field(1, 1) + field(2, 1)) + rec(4, field(1, 2) + field(2, 1) +
             field(4, b"ckpt-1")) + rec(3, field(1, 5) + field(4, 1) + field(7, b"ckpt-1")),
    "reports": rec(2, field(1, 1) + field(2, 1) + field(3, 100) + field(5, b"final")) +
               rec(3, field(1, 6) + field(9, 1)) + rec(3, field(1, 7)) + rec(6, field(3, 1)),
    "done": rec(1, field(1, 1) + field(16, 1)) + rec(1, push(0, 1, 1)) + rec(0, pull(0, 2)),
    "restore": rec(5, field(1, 3) + field(2, 4) + field(2, 3) + field(3, 0) + field(3, 0) +
                   field(4, field(1, 4) + field(2, 1) + field(3, ids) + field(4, grads))),
    "direct": rec(7, ids),
}
for name, data in seeds.items():
    open(f"{out}/{name}", "wb").write(data)
PY
echo "make_fuzz_corpus: $(find "$OUT" -type f | wc -l) seed files in $OUT"
