#!/usr/bin/env python3
"""Checks scripts/paired_auc.py against DeLong's definition computed pair by pair.

usage: paired_auc_check.py SCRIPT

On 300 random rows with ties, the script's AUCs, difference and standard errors must equal the
O(m n) definition (psi = 1, 1/2, 0 per positive-negative pair); a model against itself must give
a difference and error of 0; and files of different rows must fail with a message naming them.
"""
import math
import os
import random
import subprocess
import sys
import tempfile


def delong_by_definition(pa, pb, labels):
    pos = [i for i, y in enumerate(labels) if y == 1]
    neg = [i for i, y in enumerate(labels) if y == 0]

    def psi(x, y):
        return 1.0 if x > y else 0.5 if x == y else 0.0

    def parts(p):
        v10 = [sum(psi(p[i], p[j]) for j in neg) / len(neg) for i in pos]
        v01 = [sum(psi(p[i], p[j]) for i in pos) / len(pos) for j in neg]
        return sum(v10) / len(v10), v10, v01

    def var(a):
        mean = sum(a) / len(a)
        return sum((x - mean) ** 2 for x in a) / (len(a) - 1)

    auc_a, a10, a01 = parts(pa)
    auc_b, b10, b01 = parts(pb)
    d10 = [b - a for a, b in zip(a10, b10)]
    d01 = [b - a for a, b in zip(a01, b01)]
    return (auc_a, auc_b, auc_b - auc_a,
            math.sqrt(var(d10) / len(d10) + var(d01) / len(d01)),
            math.sqrt(var(a10) / len(a10) + var(a01) / len(a01)))


def write(path, probs, labels):
    with open(path, "w") as f:
        for p, y in zip(probs, labels):
            f.write("%r\t%d\n" % (p, y))


def run(script, a, b):
    return subprocess.run([sys.executable, script, a, b], capture_output=True, text=True)


def main():
    script = sys.argv[1]
    rng = random.Random(7)
    labels = [1 if rng.random() < 0.3 else 0 for _ in range(300)]
    # Scores that carry the label, rounded so that many tie (the midranks' case).
    pa = [round(min(1.0, max(0.0, 0.4 + 0.2 * y + rng.gauss(0, 0.2))), 2) for y in labels]
    pb = [round(min(1.0, max(0.0, 0.4 + 0.3 * y + rng.gauss(0, 0.2))), 2) for y in labels]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        fa, fb = os.path.join(tmp, "a.txt"), os.path.join(tmp, "b.txt")
        write(fa, pa, labels)
        write(fb, pb, labels)
        out = run(script, fa, fb)
        got = [float(x) for x in out.stdout.split()]
        want = delong_by_definition(pa, pb, labels)
        if out.returncode != 0 or len(got) != 5 or any(
                abs(g - w) > 1e-5 for g, w in zip(got, want)):
            failures.append("a vs b: got %r (rc %d, %s), want %r"
                            % (got, out.returncode, out.stderr.strip(), want))
        if not want[2] > 0.02:
            failures.append("the check's data should give b a clear lead, got %r" % (want,))
        out = run(script, fa, fa)
        got = [float(x) for x in out.stdout.split()]
        if out.returncode != 0 or len(got) != 5 or got[2] != 0 or got[3] != 0:
            failures.append("a vs a: got %r, want a difference and error of 0" % (got,))
        fc = os.path.join(tmp, "c.txt")
        write(fc, pb, [1 - y for y in labels])
        out = run(script, fa, fc)
        if out.returncode == 0 or "do not hold the same rows" not in out.stderr:
            failures.append("different rows: rc %d, stderr %r" % (out.returncode, out.stderr))
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("OK: paired_auc.py equals DeLong's definition on 300 rows with ties")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
