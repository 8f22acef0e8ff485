#!/usr/bin/python3
"""K-fold cross-validation inside the shared 10k head of Kaggle's train.txt (issue 13, "Defaults
that do not overfit small data"): the shared data has no Kaggle rows outside that head, so the
held-out rows of each fold come from inside it.

The 10,000 rows are shuffled once (seed 7) and cut into K folds; fold k is the test set of round
k and the other K-1 folds its training data. Each variant below trains on every round's training
data with `pstrain train` and is scored on its test fold (summary.json test_auc; for the variants
with checkpoint.keep_best also `pstrain predict --checkpoint best`). A hashed logistic regression
in NumPy (sklearn is not available) is the baseline the issue names: every field's raw value
(numeric fields bucketed as pstrain's LOG_SQUARED_BUCKET does) hashed into 2^20 weights, L2 as
sklearn's LogisticRegression (0.5 |w|^2 + C x the summed logloss; C = 1, sklearn's default, and
C = 0.1), fitted by full-batch
gradient descent with Adagrad steps (at most 400, or to a gradient norm below 1e-3 of the
start).

    python3 scripts/small_data_cv.py --pstrain build/release/pstrain --out /tmp/cv [--folds 5]

prints one line per variant: mean test AUC over the folds, its min and max, the per-fold values
and the paired difference to the hashed LR at C = 0.1 (mean over the folds +- its standard
error); docs/PERFORMANCE.md "Small real data" records a run.
"""

import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys

import numpy as np

HEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                    "criteo", "kaggle_train_head10k.tsv")
PIN = ["--set", "threads.towers=2", "--set", "threads.intra_op_threads=1",
       "--set", "threads.inter_op_threads=1"]
# Early stopping on a validation split of the training folds: 10% of the rows held out, a
# checkpoint (and its evaluation) about every half epoch of 7,200 rows at 512 rows a step.
EARLY = ["--epochs", "20", "--set", "data.validation_fraction=0.1",
         "--set", "train.early_stopping.metric=LOGLOSS",
         "--set", "train.early_stopping.patience_evals=3",
         "--set", "checkpoint.keep_best=true", "--set", "checkpoint.every_steps=7",
         "--set", "checkpoint.every_seconds=0", "--set", "checkpoint.keep=1"]
# Candidate small-data settings on top of EARLY (--only picks among them).
VARIANTS = {
    "defaults, 1 epoch": [],
    "defaults + early stopping": EARLY,
    "defaults + early stopping, sparse lr 0.02": EARLY + ["--set",
                                                         "sparse_optimizer.learning_rate=0.02"],
    "defaults + early stopping, embedding_l2 0.01": EARLY + ["--set", "model.embedding_l2=0.01"],
    "defaults + early stopping, embedding_l2 0.1": EARLY + ["--set", "model.embedding_l2=0.1"],
    "defaults + early stopping, patience 1": EARLY + ["--set",
                                                      "train.early_stopping.patience_evals=1"],
    "model.type=LR, 1 epoch": ["--set", "model.type=LR"],
    "model.type=LR + early stopping": ["--set", "model.type=LR"] + EARLY,
}


def folds(k, out):
    with open(HEAD) as f:
        lines = f.readlines()
    order = list(range(len(lines)))
    random.Random(7).shuffle(order)
    parts = [order[i::k] for i in range(k)]
    out_folds = []
    for i in range(k):
        test = set(parts[i])
        train_lines = [lines[j] for j in order if j not in test]
        test_lines = [lines[j] for j in parts[i]]
        with open(os.path.join(out, "train_%d.tsv" % i), "w") as f:
            f.writelines(train_lines)
        with open(os.path.join(out, "test_%d.tsv" % i), "w") as f:
            f.writelines(test_lines)
        out_folds.append((train_lines, test_lines))
    return out_folds


def run_pstrain(pstrain, out, fold, name, flags):
    model_dir = os.path.join(out, "m_%s_%d" % (hashlib.md5(name.encode()).hexdigest()[:8], fold))
    subprocess.run(["rm", "-rf", model_dir], check=True)
    cmd = ([pstrain, "train"] + flags + ["--train", os.path.join(out, "train_%d.tsv" % fold),
                                         "--eval", os.path.join(out, "test_%d.tsv" % fold),
                                         "--format", "criteo_tsv", "--model_dir", model_dir]
           + PIN)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    result = {"final": summary["test_auc"], "steps": summary["steps"]}
    if os.path.exists(os.path.join(model_dir, "BEST")):
        js = os.path.join(model_dir, "predict_best.json")
        p = subprocess.run([pstrain, "predict", "--model_dir", model_dir, "--checkpoint", "best",
                            "--input", os.path.join(out, "test_%d.tsv" % fold), "--summary", js],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            sys.exit("predict failed:\n" + p.stdout[-3000:])
        with open(js) as f:
            result["best"] = json.load(f)["auc"]
    return result


def auc(p, y):
    order = np.argsort(p, kind="mergesort")
    p, y = p[order], y[order]
    ranks = np.empty(len(p))
    i = 0
    while i < len(p):  # average ranks over ties
        j = i
        while j + 1 < len(p) and p[j + 1] == p[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    pos = y.sum()
    return (ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))


def hashed(lines, bits=20):
    rows, labels = [], []
    for line in lines:
        f = line.rstrip("\n").split("\t")
        f += [""] * (40 - len(f))
        labels.append(float(f[0]))
        ids = []
        for i, v in enumerate(f[1:40]):
            if i < 13 and v != "":
                x = int(v)
                v = str(int(math.floor(math.log(x) ** 2))) if x > 2 else str(x)
            h = hashlib.blake2b(("%d:%s" % (i, v)).encode(), digest_size=8).digest()
            ids.append(int.from_bytes(h, "little") & ((1 << bits) - 1))
        rows.append(ids)
    return np.array(rows, dtype=np.int64), np.array(labels)


def hashed_lr(train, test, bits=20, c=1.0):
    x, y = hashed(train, bits)
    xt, yt = hashed(test, bits)
    w, b = np.zeros(1 << bits), 0.0
    gw2, gb2 = np.full(1 << bits, 1e-8), 1e-8
    first = None
    for it in range(400):
        z = w[x].sum(axis=1) + b
        g = 1.0 / (1.0 + np.exp(-z)) - y  # dlogloss / dz per example (sum, as sklearn)
        grad = np.bincount(x.ravel(), weights=np.repeat(g, x.shape[1]), minlength=1 << bits)
        grad = c * grad + w
        gb = c * g.sum()
        norm = math.sqrt(float(grad @ grad) + gb * gb)
        first = first or norm
        if norm < 1e-3 * first:
            break
        gw2 += grad * grad
        gb2 += gb * gb
        w -= 0.5 * grad / np.sqrt(gw2)
        b -= 0.5 * gb / math.sqrt(gb2)
    return auc(w[xt].sum(axis=1) + b, yt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pstrain", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--only", default="", help="run only variants whose name contains this")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    data = folds(a.folds, a.out)
    results = {}
    for name, flags in VARIANTS.items():
        if a.only and a.only not in name:
            continue
        results[name] = [run_pstrain(a.pstrain, a.out, k, name, flags) for k in range(a.folds)]
    # The baselines run every time (the paired differences below need them), cached per fold.
    for c in (1.0, 0.1):  # sklearn's default C, and 10x its L2
        cache = os.path.join(a.out, "hashed_lr_c%g_%dfolds.json" % (c, a.folds))
        if not os.path.exists(cache):
            with open(cache, "w") as f:
                json.dump([hashed_lr(tr, te, c=c) for tr, te in data], f)
        with open(cache) as f:
            results["hashed LR (NumPy, C = %g)" % c] = [{"final": v} for v in json.load(f)]
    baseline = [r["final"] for r in results["hashed LR (NumPy, C = 0.1)"]]
    for name, rs in results.items():
        for key in ("final", "best"):
            v = [r[key] for r in rs if key in r]
            if not v:
                continue
            steps = [r["steps"] for r in rs if "steps" in r]
            # Paired with the hashed LR at C = 0.1 on the same folds: the mean difference and its
            # standard error (sample standard deviation of the K differences / sqrt(K)).
            d = [x - y for x, y in zip(v, baseline)]
            mean_d = sum(d) / len(d)
            se = math.sqrt(sum((x - mean_d) ** 2 for x in d) / (len(d) - 1) / len(d))
            print("%-45s %-5s mean %.4f  min %.4f  max %.4f  folds %s  vs LR C=0.1 %+.4f +- %.4f%s"
                  % (name, key, sum(v) / len(v), min(v), max(v), " ".join("%.4f" % x for x in v),
                     mean_d, se, "  steps %s" % steps if steps and key == "final" else ""))
            sys.stdout.flush()

if __name__ == "__main__":
    main()
