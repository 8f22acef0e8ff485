#!/usr/bin/env python3
"""bench/emulated_scaling: PS ASYNC and allreduce on N emulated hosts at several link speeds,
measured next to bench/compare's scaling model (docs/PERFORMANCE.md "Emulated hosts").

For every N in --hosts and every Mbit/s in --mbit (0 = uncapped veth), runs
  python3 bench/compare.py --emulate_hosts --hosts N --emulate_mbit M --modes train,ps-async,allreduce
with the given training flags, then prints one table (and writes scaling.json / scaling.md under
--results): measured examples/s against two predictions,
  paper:    the single-process step time x the CPU sharing factor max(1, N x threads / cores),
            plus the modelled bytes per host step / the link's rate (bench/compare's model);
  measured: the same strategy's uncapped (M = 0) step time at the same N, plus the modelled
            bytes / the link's rate: the network term alone, with the CPU sharing measured;
the bytes a host's link carried per step (its eth0 counters) against the modelled bytes, and
the share of the link rate each strategy reached (modelled network time / the capped run's step
time beyond the uncapped run's). Also writes scaling.png (measured examples/s with their ranges
against both predictions, one panel per link speed; needs gnuplot) and, in scaling.md, which
strategy the measurements say wins at each host count and link speed.
Needs root (scripts/emulate_hosts.sh). Only the Python standard library.
"""

import argparse
import json
import os
import subprocess
import sys

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "bench"))
from compare import run_gnuplot  # noqa: E402


def link_name(mbit):
    return "uncapped" if mbit == 0 else f"{mbit:g} Mbit/s"


def recommendation(points):
    """One line per (link, hosts): which strategy the measured examples/s favour, by how much,
    and what each holds per host. Measured points only: the models are not consulted."""
    lines = []
    for mbit in sorted({pt["mbit"] for pt in points}, reverse=True):
        for n in sorted({pt["hosts"] for pt in points}):
            ps = next((p for p in points if p["hosts"] == n and p["mbit"] == mbit and
                       p["mode"] == "ps-async" and p["examples_per_sec"]), None)
            ar = next((p for p in points if p["hosts"] == n and p["mbit"] == mbit and
                       p["mode"] == "allreduce" and p["examples_per_sec"]), None)
            if not ps or not ar:
                lines.append(f"- {n} hosts, {link_name(mbit)}: not compared (a strategy has no "
                             "measurement)")
                continue
            win, lose = (ps, ar) if ps["examples_per_sec"] >= ar["examples_per_sec"] else (ar, ps)
            # A lead inside the other's range over the repeats is not a lead.
            lo = (win.get("examples_per_sec_range") or [win["examples_per_sec"]])[0]
            hi = (lose.get("examples_per_sec_range") or [lose["examples_per_sec"]])[-1]
            verdict = (f"{win['mode']} wins, {win['examples_per_sec'] / lose['examples_per_sec']:.1f}x"
                       if lo > hi else "a tie within the ranges")
            mem = ""
            if ps.get("param_memory_mb_per_host") and ar.get("param_memory_mb_per_host"):
                mem = (f"; params + slots per host: PS {ps['param_memory_mb_per_host']:.1f} MB, "
                       f"allreduce {ar['param_memory_mb_per_host']:.1f} MB")
            lines.append(f"- {n} hosts, {link_name(mbit)}: {verdict} "
                         f"({ps['examples_per_sec']:.0f} against {ar['examples_per_sec']:.0f} "
                         f"ex/s){mem}")
    return lines


def plot(points, out_dir):
    """scaling.png: per link speed, measured ex/s (bars: range over the repeats) of both
    strategies against the uncapped-step + bytes / rate prediction and the paper model."""
    mbits = sorted({pt["mbit"] for pt in points})
    dat = os.path.join(out_dir, "scaling.dat")
    # One gnuplot index per (link, strategy): hosts, measured, lo, hi, measured-compute, paper.
    blocks = []
    with open(dat, "w") as f:
        for mbit in mbits:
            for mode in ("ps-async", "allreduce"):
                pts = sorted((p for p in points if p["mbit"] == mbit and p["mode"] == mode),
                             key=lambda p: p["hosts"])
                for p in pts:
                    e = p["examples_per_sec"] or float("nan")
                    lo, hi = p.get("examples_per_sec_range") or (e, e)
                    m = p["measured_compute_examples_per_sec"] or float("nan")
                    a = p["paper_examples_per_sec"] or float("nan")
                    f.write(f"{p['hosts']} {e} {lo} {hi} {m} {a}\n")
                f.write("\n\n")
                blocks.append((mbit, mode))
    panels = []
    for mbit in mbits:
        parts = []
        for i, (bm, mode) in enumerate(blocks):
            if bm != mbit:
                continue
            color = "'#1f77b4'" if mode == "ps-async" else "'#d62728'"
            parts.append(f"'{dat}' index {i} using 1:2:3:4 with yerrorlines lc rgb {color} lw 2 "
                         f"pt 7 title '{mode} measured'")
            if mbit:
                parts.append(f"'{dat}' index {i} using 1:5 with linespoints lc rgb {color} dt 2 "
                             f"pt 6 title '{mode}: uncapped step + bytes/rate'")
            parts.append(f"'{dat}' index {i} using 1:6 with linespoints lc rgb {color} dt 3 "
                         f"pt 4 title '{mode}: paper model'")
        panels.append(f"set title 'link {link_name(mbit)}'\nplot " + ", ".join(parts))
    script = f"""set terminal pngcairo size {560 * len(mbits)},520
set output '{os.path.join(out_dir, 'scaling.png')}'
set multiplot layout 1,{len(mbits)}
set xlabel 'emulated hosts'
set ylabel 'examples/s'
set logscale x 2
set xtics (2, 4, 8)
set xrange [1.6:10]
set yrange [0:*]
set key below font ',9' maxrows 3
""" + "\n".join(panels) + "\n"
    return run_gnuplot(script)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", default="2,4,8")
    p.add_argument("--mbit", default="0,100", help="link speeds; include 0 (the compute baseline)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--results", default="results/emulated_scaling")
    p.add_argument("--data", default="", help="training data pattern; {n} is replaced by N")
    p.add_argument("--report_only", action="store_true",
                   help="make the table from the newest runs already under --results")
    args, rest = p.parse_known_args(argv)
    hosts = [int(h) for h in args.hosts.split(",")]
    mbits = [float(m) for m in args.mbit.split(",")]
    if 0 not in mbits:
        p.error("--mbit must include 0: the uncapped run is the compute baseline")
    os.makedirs(args.results, exist_ok=True)
    points = []
    for n in hosts:
        for mbit in mbits:
            out = os.path.abspath(os.path.join(args.results, f"n{n}-mbit{mbit:g}"))
            cmd = [sys.executable, os.path.join(SOURCE_ROOT, "bench/compare.py"),
                   "--emulate_hosts", "--hosts", str(n), "--emulate_mbit", f"{mbit:g}",
                   "--modes", "train,ps-async,allreduce", "--repeats", str(args.repeats),
                   "--results", out] + rest
            if args.data:
                cmd += ["--train", args.data.replace("{n}", str(n))]
            if not args.report_only:
                print("[emulated_scaling] " + " ".join(cmd), flush=True)
                subprocess.run(cmd, stdout=subprocess.DEVNULL)
            stamp = sorted(os.listdir(out))[-1]
            with open(os.path.join(out, stamp, "compare.json")) as f:
                report = json.load(f)
            by_mode = {m["mode"]: m for m in report["modes"]}
            em = (report.get("scaling") or {}).get("emulated") or {}
            for mode, key in (("ps-async", "ps"), ("allreduce", "allreduce")):
                m = by_mode.get(mode, {})
                points.append({
                    "hosts": n, "mbit": mbit, "mode": mode, "status": m.get("status"),
                    "examples_per_sec": m.get("examples_per_sec"),
                    "examples_per_sec_range": m.get("examples_per_sec_range"),
                    "train_examples_per_sec": by_mode.get("train", {}).get("examples_per_sec"),
                    "paper_examples_per_sec": em.get(f"{key}_examples_per_sec"),
                    "cpu_factor": em.get("cpu_factor"),
                    "batch": (report.get("scaling") or {}).get("batch_per_host_step"),
                    "model_bytes_per_step": em.get(f"{key}_bytes_per_step"),
                    "link_bytes_per_step": m.get("link_bytes_per_host_step"),
                    "host_peak_memory_mb": m.get("host_peak_memory_mb"),
                    "param_memory_mb_per_host": m.get("param_memory_mb_per_host")})
    # The measured-compute prediction: the uncapped step at the same N plus bytes / rate.
    for pt in points:
        base = next((b for b in points if b["hosts"] == pt["hosts"] and b["mbit"] == 0 and
                     b["mode"] == pt["mode"]), None)
        pt["measured_compute_examples_per_sec"] = pt["link_efficiency"] = None
        if base and base["examples_per_sec"] and pt["batch"] and pt["model_bytes_per_step"]:
            step = pt["hosts"] * pt["batch"] / base["examples_per_sec"]
            net = pt["model_bytes_per_step"] / (pt["mbit"] * 1e6 / 8) if pt["mbit"] else 0
            pt["measured_compute_examples_per_sec"] = pt["hosts"] * pt["batch"] / (step + net)
            # The share of the link rate reached: the modelled network time over the time the
            # capped run took beyond the uncapped one.
            extra = (pt["hosts"] * pt["batch"] / pt["examples_per_sec"] - step
                     if pt["examples_per_sec"] else 0)
            pt["link_efficiency"] = net / extra if net and extra > 0 else None

    def f(v, spec=".0f"):
        return "n/a" if v is None else format(v, spec)

    lines = ["| hosts | link Mbit/s | strategy | measured ex/s (range) | paper model | measured / paper "
             "| uncapped step + bytes/rate | measured / that | link MB/step/host | model MB/step/host "
             "| link efficiency | host peak MB | params+opt MB/host |", "|" + "---|" * 13]
    for pt in points:
        e, a, b = pt["examples_per_sec"], pt["paper_examples_per_sec"], pt[
            "measured_compute_examples_per_sec"]
        rng = pt["examples_per_sec_range"]
        link = "uncapped" if pt["mbit"] == 0 else format(pt["mbit"], "g")
        lines.append(
            f"| {pt['hosts']} | {link} | "
            f"{pt['mode']} | {f(e)} ({f(rng[0]) if rng else 'n/a'}-{f(rng[1]) if rng else 'n/a'}) | "
            f"{f(a)} | {f(e / a if e and a else None, '.2f')} | {f(b)} | "
            f"{f(e / b if e and b else None, '.2f')} | "
            f"{f(pt['link_bytes_per_step'] / 1e6 if pt['link_bytes_per_step'] else None, '.2f')} | "
            f"{f(pt['model_bytes_per_step'] / 1e6 if pt['model_bytes_per_step'] else None, '.2f')} | "
            f"{f(pt['link_efficiency'], '.2f')} | "
            f"{f(pt['host_peak_memory_mb'])} | {f(pt['param_memory_mb_per_host'], '.1f')} |")
    table = "\n".join(lines)
    verdict = "\n".join(["", "Measured winner at each point (ex/s medians; a lead inside the "
                                "ranges over the repeats is called a tie):"] + recommendation(points))
    with open(os.path.join(args.results, "scaling.json"), "w") as fh:
        json.dump(points, fh, indent=1)
    with open(os.path.join(args.results, "scaling.md"), "w") as fh:
        fh.write(table + "\n" + verdict + "\n")
    print(table + "\n" + verdict)
    why = plot(points, args.results)
    print(f"[emulated_scaling] no plot: {why}" if why else
          f"[emulated_scaling] plot: {os.path.join(args.results, 'scaling.png')}")
    return 0 if all(pt["status"] == "ok" for pt in points) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
