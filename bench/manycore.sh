#!/bin/bash
# The many-core figures of docs/PERFORMANCE.md "Many cores" (issue 24), on a 16-core machine:
# the step table (in-process step against Pull/Push, alternated), `train` at its defaults and
# variants, `local --hosts 4`, `mpirun -np 4 allreduce` and PyTorch at 16 threads, with test AUC.
# usage, from the repo root: bash scripts/build.sh && bash ../shared/manycore/bundle.sh, then on
# the many-core machine: bash bench/manycore.sh OUT_DIR   (it sources .devrun/measure.sh)
O=$1; mkdir -p $O/r
ONLY_SETUP=1 source .devrun/measure.sh $O
exec > >(tee -a "$O/m2.txt") 2>&1
R=$(pwd)
nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|NUMA node\(|L3'
el data; data
cd /opt/pst; export OMP_WAIT_POLICY=PASSIVE
A="$L timeout 100 /opt/pst/bin/train_throughput_app --steps 40 --windows 3"
el step
for m in pushed pipelined pushed pipelined; do $A --mode $m --precisions f32 --batch 32 --settings 16x1,8x2 | grep -E '^f32'; done
for m in pushed pipelined; do $A --mode $m --precisions f32,bf16 --batch 64 --settings 16x1 | grep -E '^f32|^bf16'; done
for m in pushed pipelined; do $A --mode $m --precisions bf16 --batch 32 --settings 16x1 | grep -E '^bf16'; done
cd $R
unset OMP_WAIT_POLICY
run t_default 120 $P train "${C[@]}"
run t_bf16 120 $P train "${C[@]}" --set model.precision=BF16
run t_g1024 120 $P train "${C[@]}" --set train.global_batch_size=1024
run t_g1024_bf16 120 $P train "${C[@]}" --set train.global_batch_size=1024 --set model.precision=BF16
run t_old4096 120 $P train "${C[@]}" --set train.global_batch_size=0 --set train.batch_size=256
run t_2x8 120 $P train "${C[@]}" --set threads.towers=2 --set threads.intra_op_threads=8
# Towers against the parser threads (the sweep behind the automatic towers).
for t in 16 14 12 11 10; do
  run s_t${t} 60 $P train "${C[@]}" --set threads.towers=$t --set threads.intra_op_threads=1
done
for t in 16 14 12; do
  run s_t${t}_j2 60 $P train "${C[@]}" --set threads.towers=$t --set threads.intra_op_threads=1 \
    --set threads.inter_op_threads=2
done
run t_12x1 120 $P train "${C[@]}" --set threads.towers=12 --set threads.intra_op_threads=1
run ps4 150 $P local --hosts 4 "${C[@]}"
el allreduce4; rm -rf /tmp/m_ar4
timeout 150 mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH=/opt/pst/lib -np 4 $P allreduce "${C[@]}" --model_dir /tmp/m_ar4 2>&1 | grep -E '^done|rror' | tail -2; cp /tmp/m_ar4/summary.json "$O/r/allreduce4.json" 2>/dev/null
el pytorch
for b in 512 1024; do timeout 120 python3 bench/pytorch_deepfm.py --train /tmp/d/train/part-00000.tsv --procs 1 --threads 16 --batch $b --steps $((100000 / b)); done
el done
python3 - "$O/r" <<'PY'
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    if f.endswith("teacher.json"): continue
    s = json.load(open(f))
    print("%-14s auc %.5f  %8.0f ex/s  towers %s x %s  step %s  %s" % (os.path.basename(f)[:-5], s.get("test_auc", 0), s.get("examples_per_sec", 0), s.get("towers"), s.get("intra_op_threads"), s.get("step_batch"), s.get("precision")))
PY
(cd "$O" && tar -czf res.tgz r)
