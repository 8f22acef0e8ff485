#!/usr/bin/env python3
"""Sums oneDNN's per-primitive execution times by GEMM shape, to tell "the GEMMs run slower in
the step than alone" from "work outside the GEMMs" (docs/PERFORMANCE.md, issue 29).

Run a bench app with oneDNN's verbose log (oneDNN 2.x: ONEDNN_VERBOSE=1 prints one
`onednn_verbose,exec,...,<problem>,<ms>` line per primitive execution):

  ONEDNN_VERBOSE=1 build/release/bench/train_throughput_app --model dlrm --settings 2x1 \
      --precisions f32 --windows 3 --steps 10 --pool 8 > /tmp/v.txt 2>&1
  bench/onednn_exec_shapes.py /tmp/v.txt --tower_steps 76 --roof_gflops 188

The model's own primitives (worker/model/mlp.cc, matmul.cc, bottom_mlp.cc) are created with a
user scratchpad (`attr-scratchpad:user`); the roof's (bench/gemm_peak.h) are not: only the
former are summed. For each step shape (problem and src/weights layouts, ab or ba) the table
gives the executions, their total and median ms and the GFLOP/s of one stream (2 M K N over
the execution's time). The last line sets the step's GEMM ms per tower step against what the
same GEMMs would take at the app's own roof (--roof_gflops, the "model's own GEMMs' roof" the
app printed, shared by --streams concurrent towers: each tower's GEMMs get roof / streams).
--tower_steps: how many tower steps the log covers (towers x (warm-up + timed) steps); without
it, the executions of the first step shape.

Caveat: on a 2-vCPU machine whose vCPUs share one core's FMA units (the app's 2-thread GEMM
peak equals its 1-thread peak), one execution's time depends on what the other tower ran
meanwhile; the sums are what to read.
"""
import argparse
import collections
import statistics
import sys


def parse(path):
    """(is_step, layouts, problem) -> list of ms, from the exec lines of a verbose log."""
    times = collections.defaultdict(list)
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith("onednn_verbose,exec,"):
                continue
            p = line.rstrip("\n").split(",")
            if len(p) < 10 or p[3] != "matmul":
                continue
            try:
                ms = float(p[-1])
            except ValueError:
                continue
            descs = p[6].split()
            # src/wei layouts (ab or ba) name the transposes; the bias and dst do not change them.
            layouts = " ".join(d.split("::")[0] + ":" + d.split(":")[-2]
                               for d in descs if d.startswith(("src_", "wei_")))
            step = "attr-scratchpad:user" in p[7]
            times[(step, layouts, p[-2])].append(ms)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--tower_steps", type=int, default=0)
    ap.add_argument("--roof_gflops", type=float, default=0.0)
    ap.add_argument("--streams", type=int, default=2)
    args = ap.parse_args()
    times = parse(args.log)
    step_keys = [k for k in times if k[0]]
    if not step_keys:
        sys.exit(f"{args.log}: no step executions (attr-scratchpad:user) of a matmul; was "
                 "ONEDNN_VERBOSE=1 set?")
    tower_steps = args.tower_steps or len(times[step_keys[0]])
    print("| shape (M x K : K x N) | layouts | execs | total ms | median ms | GFLOP/s a stream |")
    print("|---|---|---|---|---|---|")
    step_ms = step_gflop = 0.0
    for key in step_keys:
        ts = times[key]
        m, k = (int(x) for x in key[2].split(":")[0].split("x"))
        n = int(key[2].split(":")[1].split("x")[1])
        gflop = 2e-9 * m * k * n * len(ts)
        step_ms += sum(ts)
        step_gflop += gflop
        print(f"| {key[2]} | {key[1]} | {len(ts)} | {sum(ts):.1f} | "
              f"{statistics.median(ts):.3f} | {gflop / sum(ts) * 1e3:.0f} |")
    line = (f"\nstep GEMMs: {step_ms / tower_steps:.2f} ms a tower step "
            f"({step_gflop / step_ms * 1e3:.0f} GFLOP/s a stream, {tower_steps} tower steps)")
    if args.roof_gflops > 0:
        at_roof = step_gflop / (args.roof_gflops / args.streams) * 1e3 / tower_steps
        line += f"; at the roof ({args.roof_gflops:g} / {args.streams}): {at_roof:.2f} ms"
    print(line)

if __name__ == "__main__":
    main()
