#!/usr/bin/env bash
# Writes the seed corpora of fuzz/ (fuzz/corpus/<target>/) with pstrain itself: a few records in
# every data format (datagen, convert), plain, gzip'ed and large; the files of a small checkpoint
# and its whole directory (train, full and incremental); its serving export in each row encoding
# (export); the shipped configs and configs at validation's bounds; and, encoded by the Python
# below as each target's comment describes, shard requests, Predict requests, the launcher's
# environment (TF_CONFIG, SageMaker's JSON, secrets, manifests), shard answers and HTTP requests.
# Small files only (the whole corpus stays under 2 MB); /work/shared/data is never copied.
# Files named regression-* are inputs that once failed (docs/FUZZING.md "Findings fixed"): they
# are kept, never rewritten.
# usage: scripts/make_fuzz_corpus.sh [path/to/pstrain]   (default build/release/pstrain)
set -euo pipefail
cd "$(dirname "$0")/.."
PSTRAIN="${1:-build/release/pstrain}"
OUT=fuzz/corpus
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

targets=(criteo_tsv csv libsvm tfrecord recordio checkpoint config shard_requests export_model
         serve_requests checkpoint_dir cluster_env ps_client_answers metrics)
for t in "${targets[@]}"; do
  mkdir -p "$OUT/$t"
  find "$OUT/$t" -type f ! -name 'regression-*' -delete
done

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

# Gzip (every reader detects it by its magic bytes): each format's seed compressed, two gzip
# members concatenated (one stream, as gzip(1) reads them), and a small bomb (2 MB of zeros in
# about 2 kB) against the readers' record limit.
for fmt in criteo_tsv csv libsvm tfrecord recordio; do
  src="$OUT/$fmt/four.$fmt"
  if [ "$fmt" = criteo_tsv ]; then src="$OUT/$fmt/four.tsv"; fi
  if [ "$fmt" = libsvm ]; then src="$OUT/$fmt/three.libsvm"; fi
  gzip -9 -n -c "$src" > "$OUT/$fmt/seed.gz"
  cat "$OUT/$fmt/seed.gz" "$OUT/$fmt/seed.gz" > "$OUT/$fmt/two_members.gz"
done
head -c 2000000 /dev/zero | gzip -9 -n -c > "$OUT/criteo_tsv/zeros_bomb.gz"

# Large inputs, past the 64 kB the fuzzers used to take (they take up to 1 MB now,
# scripts/fuzz.sh): 400 rows of TSV (about 96 kB), and the same rows in every other format,
# gzip'ed (small here, large once read). Not larger: each execution reads its whole input, and
# libFuzzer mutates these as often as the small seeds.
"$PSTRAIN" datagen --rows 400 --seed 11 --out "$tmp/big" > /dev/null 2>&1
cp "$tmp"/big/part-00000.tsv "$OUT/criteo_tsv/large.tsv"
for fmt in csv tfrecord recordio; do
  "$PSTRAIN" convert --input "$tmp/big/part-00000.tsv" --from criteo_tsv --to "$fmt" \
    --out "$tmp/big_$fmt" > /dev/null 2>&1
  gzip -9 -n -c "$tmp/big_$fmt"/part-* > "$OUT/$fmt/large.gz"
done
# LibSVM: 1,000 lines of 12 id:value pairs (about 100 kB), as many records as the TSV file's
# order of magnitude, not 10 times more.
awk 'BEGIN { for (i = 0; i < 1000; ++i) { printf "%d", i % 2
             for (j = 0; j < 12; ++j) printf " %d:%d.25", (i * 7 + j * 3) % 39, i + j
             printf "\n" } }' | gzip -9 -n -c > "$OUT/libsvm/large.gz"

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

# Checkpoint directories (fuzz/checkpoint_dir_fuzzer.cc): a checkpoint every step, full ones
# and, in a second run, incremental ones (deltas every other step), 4 steps, all kept.
"$PSTRAIN" train --config "$tmp/tiny.textproto" --train "$tmp/tsv/part-00000.tsv" \
  --model_dir "$tmp/steps" --set train.max_steps=4 --set checkpoint.every_steps=1 \
  --set checkpoint.keep=10 > /dev/null 2>&1
"$PSTRAIN" train --config "$tmp/tiny.textproto" --train "$tmp/tsv/part-00000.tsv" \
  --model_dir "$tmp/deltas" --set train.max_steps=4 --set checkpoint.every_steps=1 \
  --set checkpoint.keep=10 --set checkpoint.incremental_every=2 > /dev/null 2>&1

# The serving export of the tiny model in each row encoding (fuzz/export_model_fuzzer.cc).
for rows in f32 bf16 int8; do
  "$PSTRAIN" export --model_dir "$tmp/model" --out "$tmp/export_$rows" --rows "$rows" \
    > /dev/null 2>&1
  cp "$tmp/export_$rows"/*/MODEL "$OUT/export_model/$rows"
done
# An export with tables (format version 2, docs/SERVING.md "Tables"): `item` shared by a field and
# a history list, `small` of dim 2 (its rows 3 floats wide), `user` in the default table.
cat > "$tmp/tables.textproto" <<'CFG'
data { train { name: "train" format: CSV } }
features {
  preset: NO_PRESET
  field { name: "item" table: "item" }
  field { name: "history" table: "item" list { combiner: MEAN max_length: 4 } }
  field { name: "user" vocab_size: 12 }
  field { name: "cat" table: "small" }
  table { name: "item" rows: 24 initializer { type: UNIFORM limit: 0.1 } }
  table { name: "small" dim: 2 rows: 6 fm_join: EXCLUDE }
}
model { type: DEEPFM embedding_dim: 4 hidden: [ 4 ] }
train { batch_size: 16 epochs: 1 log_every_steps: 100000 }
threads { towers: 1 intra_op_threads: 1 inter_op_threads: 1 }
CFG
printf 'label,item,history,user,cat\n1,i1,i2|i3,u1,c1\n0,i4,,u2,c2\n1,i2,i1|i4|i5,u3,c3\n0,i5,i6,u4,c1\n' \
  > "$tmp/tables.csv"
"$PSTRAIN" train --config "$tmp/tables.textproto" --train "$tmp/tables.csv" \
  --model_dir "$tmp/tables_model" > /dev/null 2>&1
for rows in f32 int8; do
  "$PSTRAIN" export --model_dir "$tmp/tables_model" --out "$tmp/tables_export_$rows" \
    --rows "$rows" > /dev/null 2>&1
  cp "$tmp/tables_export_$rows"/*/MODEL "$OUT/export_model/tables_$rows"
done

# Configs: the shipped ones, and overrides.
cp configs/*.textproto "$OUT/config/"
printf 'cluster.lease_ms=5000\n' > "$OUT/config/override_lease"
printf 'data.train[0].shard_policy=SHARD_BY_RECORD\n' > "$OUT/config/override_channel"
# At validation's bounds (common/config.h): the widest layers, the most layers, the largest
# batches; each must either be refused or build within the fuzzer's memory cap.
printf 'model.hidden=[65536]\nmodel { embedding_dim: 16 }\n' > "$OUT/config/override_wide_layer"
printf 'model { embedding_dim: 8 hidden: [%s] }\n' "$(seq -s, 64 | sed 's/[0-9]*/64/g')" \
  > "$OUT/config/many_layers.textproto"
printf 'train { batch_size: 1048576 eval_batch_size: 1048576 }\nthreads { towers: 1024 }\n' \
  > "$OUT/config/large_batches.textproto"
cp "$tmp/tiny.textproto" "$OUT/config/tiny.textproto"

# The targets whose inputs are encoded (each target's comment gives its layout): shard requests,
# Predict and Reload requests, checkpoint directories, the launcher's environment, shard answers
# and HTTP requests. Protobuf messages are written by hand (field numbers from proto/pstrain/).
python3 - "$OUT" "$tmp" <<'PY'
import os, struct, sys
out, tmp = sys.argv[1], sys.argv[2]
def write(target, name, data):
    with open(f"{out}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
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
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return varint(num << 3 | 2) + varint(len(value)) + value
    if isinstance(value, float):
        return varint(num << 3 | 1) + struct.pack("<d", value)
    return varint(num << 3) + varint(value)
def piece(data):
    data = data if isinstance(data, bytes) else data.encode()
    return struct.pack("<H", len(data)) + data

# shard_requests: [mode byte][kind][2-byte length][request]... Mode 12: SYNC, 2 workers, 64 rows;
# 13: ASYNC; 17: BOUNDED, staleness 1; 140: SYNC, 2 workers, 1024 rows. Kinds 8..11: over gRPC.
def rec(kind, msg):
    return bytes([kind]) + struct.pack("<H", len(msg)) + msg
ids = struct.pack("<3q", 1, 5, 33)
grads = struct.pack("<9f", *([0.25] * 9))
dense = struct.pack("<5f", *([0.5] * 5))
pull = lambda w, step: field(1, ids) + field(2, 1) + field(3, w) + field(4, step)
push = lambda w, step, seq: (field(1, w) + field(2, 7) + field(3, seq) + field(4, step) +
                             field(5, ids) + field(6, grads) + field(7, dense))
steps = (rec(1, push(0, 1, 1)) + rec(1, push(1, 1, 1)) + rec(0, pull(0, 2)) +
         rec(1, push(0, 2, 2)) + rec(0, pull(1, 2)))
seeds = {
    "sync_steps": bytes([12]) + steps,
    "async_steps": bytes([13]) + steps,
    "bounded_steps": bytes([17]) + steps,
    "large_table": bytes([140]) + steps,
    "round": bytes([12]) + rec(3, field(1, 1) + field(2, 0)) + rec(3, field(1, 2) + field(2, 0) +
             field(4, 1) + field(5, b"state")) + rec(3, field(1, 3) + field(4, 1) + field(6, 2)) +
             rec(4, field(1, 1) + field(2, 1)) + rec(4, field(1, 2) + field(2, 1) +
             field(4, b"ckpt-1")) + rec(3, field(1, 5) + field(4, 1) + field(7, b"ckpt-1")),
    "reports": bytes([12]) + rec(2, field(1, 1) + field(2, 1) + field(3, 100) +
               field(5, b"final")) + rec(3, field(1, 6) + field(9, 1)) + rec(3, field(1, 7)) +
               rec(6, field(3, 1)),
    "done": bytes([12]) + rec(1, field(1, 1) + field(16, 1)) + rec(1, push(0, 1, 1)) +
            rec(0, pull(0, 2)),
    "restore": bytes([12]) + rec(5, field(1, 3) + field(2, 4) + field(2, 3) + field(3, 0) +
               field(3, 0) + field(4, field(1, 4) + field(2, 1) + field(3, ids) +
               field(4, grads))),
    "direct": bytes([13]) + rec(7, ids),
    # Over gRPC: the right secret (0), none (1), a wrong one of 8 bytes (2 + 4 * 8).
    "grpc_with_secret": bytes([12]) + rec(9, b"\0" + push(0, 1, 1)) + rec(8, b"\0" + pull(0, 1)) +
                        rec(10, b"\0" + field(3, 0)) + rec(11, b"\0" + field(1, 1)),
    "grpc_without_secret": bytes([12]) + rec(9, b"\1" + push(0, 1, 1)) + rec(8, b"\1" + pull(0, 1)),
    "grpc_wrong_secret": bytes([12]) + rec(8, bytes([2 + 4 * 8]) + b"notright" + pull(0, 1)),
    "grpc_garbage": bytes([12]) + rec(8, b"\0\xff\xff\xff\xff\x0f") + rec(9, b"\0\x0a\xff"),
}
for name, data in seeds.items():
    write("shard_requests", name, data)

# serve_requests: [mode byte][a pstrain.PredictRequest]; mode 0 parses only, 2 also sends it to
# the server, 3 is a Reload ([token choice byte][token piece] then the body), 1 (5: mode 0644) is
# the admin token's file.
tsv = open(f"{tmp}/tsv/part-00000.tsv").read().splitlines()
csv_rows = [r.replace("\t", ",") for r in tsv]
no_label = [r.split("\t", 1)[1] for r in tsv]
example = field(1, field(1, "I1") + field(2, 3.0)) + field(1, field(1, "I2") + field(2, 0.5)) + \
          field(1, field(1, "C1") + field(3, "68fd1e64")) + field(1, field(1, "C2") + field(4, 1234))
requests = {
    "tsv_rows": b"".join(field(2, r) for r in no_label),
    "tsv_rows_with_label": b"".join(field(2, r) for r in tsv) + field(3, 1),
    "csv_rows": field(1, 1) + b"".join(field(2, r) for r in csv_rows) + field(3, 1) + field(5, 1),
    "examples": field(4, example) + field(4, example) + field(5, 1),
    "bad_format": field(1, 7) + field(2, no_label[0]),
}
for name, body in requests.items():
    write("serve_requests", name, b"\0" + body)
    write("serve_requests", "sent_" + name, b"\2" + body)
write("serve_requests", "reload", b"\3\0")
write("serve_requests", "reload_wrong_token", b"\3\1" + piece("Bearer not-the-token"))
write("serve_requests", "garbage", b"\2\xff\xff\xff\xff\x0f")
write("serve_requests", "token_file", b"\1  0123456789abcdef-admin-token\n")
write("serve_requests", "token_file_others_read", b"\5" + b"0123456789abcdef-admin-token\n")
write("serve_requests", "token_file_short", b"\1short\n")
write("serve_requests", "token_file_space", b"\1" + b"0123456789 abcdef admin\n")

# checkpoint_dir: [keep byte][kind][2-byte step][2-byte length][bytes]... (kind 0 LATEST, 1 BEST,
# 2..4 a checkpoint's MANIFEST / shard / worker state, 5 and 6 symlinks out, 7 any file).
def entry(kind, step, data):
    data = data if isinstance(data, bytes) else data.encode()
    return bytes([kind]) + struct.pack("<H", step) + piece(data)
def encode_dir(d):
    b = b""
    for name in sorted(os.listdir(d)):
        path = f"{d}/{name}"
        if name in ("LATEST", "BEST"):
            b += entry(0 if name == "LATEST" else 1, 0, open(path, "rb").read())
        elif os.path.isdir(path) and name.startswith("ckpt-"):
            for f in sorted(os.listdir(path)):
                b += entry(7, 0, f"{name}/{f}\n".encode() + open(f"{path}/{f}", "rb").read())
    return b
for name, keep in (("steps", 2), ("deltas", 1)):
    if os.path.isdir(f"{tmp}/{name}"):
        write("checkpoint_dir", name, bytes([keep]) + encode_dir(f"{tmp}/{name}"))
if os.path.isdir(f"{tmp}/steps"):
    base = encode_dir(f"{tmp}/steps")
    write("checkpoint_dir", "symlinks_out", bytes([1]) + base + entry(5, 0, b"") + entry(6, 0, b"") +
          entry(6, 5, b"") + entry(5, 3, b""))
    write("checkpoint_dir", "best_and_strays", bytes([1]) + base + entry(1, 0, "ckpt-2\n") +
          entry(7, 0, "ckpt-007/\n") + entry(7, 0, ".removing-ckpt-1-9-9/x\ny") +
          entry(0, 0, " ckpt-4 \n"))
write("checkpoint_dir", "bad_latest", bytes([1]) + entry(0, 0, "ckpt-99999999999999999999\n"))

# cluster_env: pieces TF_CONFIG, SM_HOSTS, SM_CURRENT_HOST, resourceconfig.json, --cluster, then an
# index byte, OMPI rank and size, hyperparameters.json, inputdataconfig.json, the secret file,
# PSTRAIN_CLUSTER_SECRET, and the manifest (the rest).
def env(tf="", hosts="", current="", resource="", cluster="", index=0, rank="", world="", hp="",
        idc="", secret="", secret_env="", manifest=""):
    return (piece(tf) + piece(hosts) + piece(current) + piece(resource) + piece(cluster) +
            bytes([index]) + piece(rank) + piece(world) + piece(hp) + piece(idc) + piece(secret) +
            piece(secret_env) + manifest.encode())
sagemaker_tf = ('{"cluster": {"master": ["algo-1:2222"], "worker": ["algo-2:2222"], '
                '"ps": ["algo-1:2223", "algo-2:2223"]}, "task": {"type": "worker", "index": 0}}')
kubeflow_tf = ('{"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], '
               '"ps": ["p0:2223", "p1:2223"]}, "task": {"type": "ps", "index": 1}}')
write("cluster_env", "tf_config_sagemaker", env(tf=sagemaker_tf))
write("cluster_env", "tf_config_kubeflow_ps", env(tf=kubeflow_tf))
write("cluster_env", "tf_config_evaluator",
      env(tf='{"cluster": {"chief": ["c:2222"]}, "task": {"type": "evaluator", "index": 0}}'))
write("cluster_env", "sagemaker_hosts",
      env(hosts='["algo-1", "algo-2"]', current="algo-2",
          resource='{"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}',
          hp='{"config": "/opt/ml/code/deepfm.textproto", "epochs": "2", "format": "criteo_tsv", '
             '"train.batch_size": "512", "sagemaker_program": "x"}',
          idc='{"train": {"TrainingInputMode": "Pipe", "S3DistributionType": "ShardedByS3Key", '
              '"CompressionType": "Gzip"}}'))
write("cluster_env", "mpirun", env(cluster="h1:2223,h2:2223,h3", index=0, rank="1", world="3"))
write("cluster_env", "flags_and_secret",
      env(cluster="10.0.0.1:2223,10.0.0.2", index=2, secret="0123456789abcdef0123456789abcdef\n",
          secret_env="fedcba9876543210fedcba9876543210"))
write("cluster_env", "manifest",
      env(manifest='[{"prefix": "s3://bucket/data/"}, "part-0.tsv", "part-1.tsv"]'))
write("cluster_env", "manifest_local",
      env(manifest='[{"prefix": "./"}, "input.manifest", "input.manifest"]'))
write("cluster_env", "deep_json", env(tf="[" * 40 + "]" * 40, hosts="{\"a\":" * 40))

# ps_client_answers: [mode byte][op][count][per shard: status byte, 2-byte length, answer]...
# Two shards over 64 rows in 8 partitions (partition p = rows [8p, 8p + 8) on shard p % 2); the
# dense vector of 5 floats is [0, 3) on shard 0 and [3, 5) on shard 1. Op 0 pulls ids
# (i * 7 + count) % 64, i < count, with the dense vector when count is odd.
def pull_answer(count, s, versions=False):
    n = sum(1 for i in range(count) if ((i * 7 + count) % 64 // 8) % 2 == s)
    a = field(1, struct.pack(f"<{3 * n}f", *([0.5] * 3 * n))) + field(5, 77)
    if count % 2:
        a += field(2, struct.pack(f"<{3 - s}f", *([0.25] * (3 - s)))) + field(3, 3 * s) + field(6, 1)
    if versions:
        a += field(7, struct.pack(f"<{n}I", *([1] * n))) + field(16, 1)
    return a
def op(kind, count, answers, status=(0, 0)):
    return bytes([kind, count]) + b"".join(bytes([status[s]]) + piece(answers[s]) for s in (0, 1))
info = lambda s: (field(1, s) + field(2, field(1, 64) + field(2, 8) + field(3, 2) + field(4, 3) +
                  field(5, 5)) + field(3, 1) + field(5, 3 * s) + field(6, 3 - s) + field(7, 77) +
                  field(11, 1))
training = (op(3, 0, [info(0), info(1)]) + op(0, 17, [pull_answer(17, 0), pull_answer(17, 1)]) +
            op(1, 17, [field(3, 77), field(3, 77)]) + op(2, 0, [b"", b""]) +
            op(0, 16, [pull_answer(16, 0, True), pull_answer(16, 1, True)]) +
            op(1, 16, [field(2, 2), field(1, 1)]))
for mode, name in ((0, "async"), (1, "bounded"), (2, "sync")):
    write("ps_client_answers", name, bytes([mode]) + training)
write("ps_client_answers", "short_rows", b"\0" + op(0, 17, [field(1, b"\0" * 4), pull_answer(17, 1)]))
write("ps_client_answers", "errors", b"\0" + op(0, 17, [b"", b""], (200, 206)) +
      op(1, 17, [b"", b""], (207, 0)))
write("ps_client_answers", "restarted", b"\0" + op(0, 17, [pull_answer(17, 0), pull_answer(17, 1)]) +
      op(0, 17, [pull_answer(17, 0) + field(5, 78), pull_answer(17, 1)]))

# metrics: HTTP requests as a scraper or a hostile client sends them.
write("metrics", "scrape", "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n")
write("metrics", "scrape_gzip", "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
write("metrics", "http10", "GET /metrics HTTP/1.0\r\n\r\n")
write("metrics", "other_path", "POST /x?y=%00 HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody")
write("metrics", "partial", "GET /metr")
write("metrics", "pipelined", "GET /metrics HTTP/1.1\r\n\r\n" * 3)
write("metrics", "long_header", "GET /metrics HTTP/1.1\r\nX: " + "a" * 20000 + "\r\n\r\n")
PY
echo "make_fuzz_corpus: $(find "$OUT" -type f | wc -l) seed files in $OUT"
