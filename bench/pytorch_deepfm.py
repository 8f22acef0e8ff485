#!/usr/bin/python3
"""The PyTorch reference for pstrain's DeepFM: the same model, data, optimizers and global batch,
trained by PyTorch on the same machine, so that pstrain's throughput and AUC can be quoted as
ratios to a peer measured in the same session (docs/PERFORMANCE.md).

Model (as configs/deepfm_criteo.textproto): 39 fields (13 numeric counts bucketed with
floor(ln(x)^2) as FuxiCTR does, 26 hashed categorical), one table of 13 x 1,024 + 26 x 1,000,000
rows of [w, v_1..v_16] (sparse=True), first-order + FM + MLP 624-400-400-400-1 (ReLU), sigmoid
cross-entropy; sparse Adagrad lr 0.05 (initial accumulator 1e-4) for the table, Adam 1e-3 for the
MLP and bias; global batch 512, one epoch.

Modes:
  --procs 1 --threads 2   one process, intra-op threads = 2 (torch.set_num_threads)
  --procs 2 --threads 1   two DistributedDataParallel ranks (gloo) of batch 256 each

It needs Debian's python3-torch (1.13; `bash scripts/install_bench_deps.sh --torch`), run with
/usr/bin/python3 (a pyenv python does not see Debian's packages). Prints one JSON line.

usage: /usr/bin/python3 bench/pytorch_deepfm.py --train data/train/part-00000.tsv \
         [--test data/test/part-00000.tsv] [--rows N] [--procs 1] [--threads 2] [--steps 0]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

NUM_NUMERIC, NUM_CATEGORICAL, DIM = 13, 26, 16
NUMERIC_ROWS, CATEGORICAL_ROWS = 1024, 1_000_000


def field_offsets():
    rows = [NUMERIC_ROWS] * NUM_NUMERIC + [CATEGORICAL_ROWS] * NUM_CATEGORICAL
    return np.cumsum([0] + rows[:-1]).astype(np.int64), np.array(rows, dtype=np.int64), sum(rows)


def bucket(x):
    return int(math.floor(math.log(x) ** 2)) if x > 2 else int(x)


def load_tsv(path, max_rows):
    """Criteo TSV -> (labels float32 [n], ids int64 [n, 39]); row 0 of a field is "missing"."""
    offsets, rows, _ = field_offsets()
    labels, ids = [], []
    with open(path) as f:
        for line in f:
            if max_rows and len(labels) >= max_rows:
                break
            parts = line.rstrip("\n").split("\t")
            parts += [""] * (40 - len(parts))
            labels.append(float(parts[0]))
            r = []
            for j in range(NUM_NUMERIC):
                v = parts[1 + j]
                r.append(0 if v == "" else 1 + bucket(float(v)) % (NUMERIC_ROWS - 1))
            for j in range(NUM_CATEGORICAL):
                v = parts[1 + NUM_NUMERIC + j]
                r.append(0 if v == "" else 1 + int(v, 16) % (CATEGORICAL_ROWS - 1))
            ids.append(r)
    return np.array(labels, dtype=np.float32), np.array(ids, dtype=np.int64) + offsets


def auc(labels, scores):
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    # Average ranks of ties.
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def build(torch):
    nn = torch.nn
    _, _, total = field_offsets()

    class DeepFM(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(total, 1 + DIM, sparse=True)
            nn.init.normal_(self.table.weight, 0.0, 0.01)
            with torch.no_grad():
                self.table.weight[:, 0] = 0.0  # first-order weights start at 0, as pstrain's
            self.bias = nn.Parameter(torch.zeros(1))
            layers, width = [], (NUM_NUMERIC + NUM_CATEGORICAL) * DIM
            for out in (400, 400, 400):
                layers += [nn.Linear(width, out), nn.ReLU()]
                width = out
            layers.append(nn.Linear(width, 1))
            self.mlp = nn.Sequential(*layers)

        def forward(self, ids):
            rows = self.table(ids)  # [b, 39, 17]
            w, v = rows[:, :, 0], rows[:, :, 1:]
            fm = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)
            return self.bias + w.sum(1) + fm + self.mlp(v.flatten(1)).squeeze(1)

    return DeepFM()


def train(rank, procs, args, result_queue=None):
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    if procs > 1:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=rank, world_size=procs)
    labels, ids = load_tsv(args.train, args.rows)
    # Each rank trains its contiguous share, as pstrain's record sharding does.
    share = len(labels) // procs
    labels, ids = labels[rank * share:(rank + 1) * share], ids[rank * share:(rank + 1) * share]
    model = build(torch)
    sparse = [model.table.weight]
    dense = [p for n, p in model.named_parameters() if n != "table.weight"]
    if procs > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt_sparse = torch.optim.Adagrad(sparse, lr=0.05, initial_accumulator_value=1e-4)
    opt_dense = torch.optim.Adam(dense, lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batch = args.batch // procs
    steps = len(labels) // batch if args.steps == 0 else min(args.steps, len(labels) // batch)
    warmup = min(5, max(steps - 1, 0))
    x, y = torch.from_numpy(ids), torch.from_numpy(labels)
    start = None
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        b = slice(step * batch, (step + 1) * batch)
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss = loss_fn(model(x[b]), y[b])
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
    seconds = time.perf_counter() - start if start is not None else 0.0
    timed_examples = (steps - warmup) * batch * procs
    out = {"rank": rank, "steps": steps, "examples_per_sec": timed_examples / seconds if seconds else 0}
    if rank == 0 and args.test:
        tl, ti = load_tsv(args.test, 0)
        with torch.no_grad():
            net = model.module if procs > 1 else model
            scores = torch.cat([net(torch.from_numpy(ti[i:i + 4096])) for i in range(0, len(tl), 4096)])
        out["test_auc"] = auc(tl, scores.numpy())
        out["test_examples"] = int(len(tl))
    if result_queue is not None:
        result_queue.put(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test")
    ap.add_argument("--rows", type=int, default=0, help="train on the first N rows (0 = all)")
    ap.add_argument("--batch", type=int, default=512, help="global batch")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch threads per process")
    ap.add_argument("--steps", type=int, default=0, help="stop after N steps (0 = one epoch)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("pytorch_deepfm: no torch for " + sys.executable + "; install Debian's "
                 "python3-torch (scripts/install_bench_deps.sh --torch) and run /usr/bin/python3")
    if args.procs == 1:
        results = [train(0, 1, args)]
    else:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=train, args=(r, args.procs, args, q)) for r in range(args.procs)]
        for p in procs:
            p.start()
        results = [q.get(timeout=7200) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    results.sort(key=lambda r: r["rank"])
    summary = {"peer": "pytorch", "torch": torch.__version__, "procs": args.procs,
               "threads": args.threads, "batch": args.batch,
               "examples_per_sec": min(r["examples_per_sec"] for r in results),
               "steps_per_rank": results[0]["steps"]}
    for k in ("test_auc", "test_examples"):
        if k in results[0]:
            summary[k] = results[0][k]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
