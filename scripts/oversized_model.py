#!/usr/bin/env python3
"""scripts/oversized_model: a model larger than one host's memory, trained by the parameter server
across emulated hosts (issue 15, docs/PERFORMANCE.md "A model larger than one host").

One command, from a fresh clone (root; builds pstrain with scripts/build.sh when it is missing):

    python3 scripts/oversized_model.py [--rows 7000000] [--hosts 2,4] [--work DIR]

1. `pstrain datagen`: a train and a test set that share the teacher, with high-cardinality
   fields (--high_cardinality_fields, 500M values each, Zipf exponent 0.5: most values are new,
   so the trained rows grow with the data).
2. A config fragment: those fields get --wide_vocab rows each (the others keep
   --categorical_vocab), so that the trained rows, not collisions, decide the model's size.
3. `pstrain train`, one process, no memory cap: the reference AUC, and the model's size M =
   parameter + optimizer bytes of its summary.json "memory" (the trained rows and their slots,
   plus the dense vector and its slots).
4. The per-host cap: C = M / --ratio (1.5), so the model is 1.5x one host.
5. The PS on N emulated hosts (scripts/emulate_hosts.sh, one `pstrain host` a namespace, each in
   a memory cgroup of C) for each N of --hosts: each shard holds about M / N. Its test AUC
   against the single run's, its bytes per shard (summary.json), each host's peak anonymous
   memory (sampled from its cgroup) and cgroup peak (hosts.json: page cache included). These
   runs take incremental checkpoints every --checkpoint_every_steps (a checkpoint's instant is a
   copy-on-write image, so only the rows updated while a shard writes cost memory; deltas keep
   those writes short) over 64 partitions (the default 4 a shard are contiguous row ranges: the
   wide fields' rows would land on a few shards).
6. `pstrain allreduce` on 2 emulated hosts with the same cap: every rank would need M, so it
   must refuse at startup (FAILED_PRECONDITION), never be OOM-killed.
7. A table (Markdown and JSON) in WORK/oversized.md and WORK/oversized.json.

At the defaults (7M rows, M = 3.4 GB) the data take 1.7 GB and each run 5-15 minutes on 2
shared cores; each PS run's checkpoint chain (4-7 GB) is removed unless --keep_checkpoints.

Exit 0 when every step did what it must: the runs that must train trained, the AUC gaps are
within --auc_tolerance, allreduce refused; else 1 (the table says which). Python standard
library only.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="/tmp/oversized_model", help="data, models, logs, the table")
    p.add_argument("--binary", default=os.path.join(SOURCE_ROOT, "build/release/pstrain"))
    p.add_argument("--rows", type=int, default=7000000, help="training rows")
    p.add_argument("--test_rows", type=int, default=200000)
    p.add_argument("--files", type=int, default=8, help="part files (a multiple of every N)")
    p.add_argument("--high_cardinality_fields", default="C3,C4,C12,C16,C21,C24",
                   help="datagen's high-cardinality fields (Criteo's largest)")
    p.add_argument("--high_cardinality", type=int, default=500000000)
    p.add_argument("--high_cardinality_zipf_exponent", type=float, default=0.5)
    p.add_argument("--wide_vocab", type=int, default=0,
                   help="embedding rows of each high-cardinality field (0: the training rows)")
    p.add_argument("--categorical_vocab", type=int, default=200000,
                   help="rows of every other categorical field")
    p.add_argument("--hosts", default="2,4", help="PS host counts")
    p.add_argument("--ratio", type=float, default=1.5, help="model size / per-host cap")
    p.add_argument("--auc_tolerance", type=float, default=0.003)
    p.add_argument("--config", default=os.path.join(SOURCE_ROOT, "configs/deepfm_criteo.textproto"))
    p.add_argument("--train_towers", type=int, default=2,
                   help="towers of the single-process run (the PS hosts have 1 each)")
    p.add_argument("--checkpoint_every_steps", type=int, default=100,
                   help="PS runs: an incremental checkpoint every K chief steps (see below)")
    p.add_argument("--tag", default="ovm", help="namespace prefix (emulate_hosts --tag ovm<N>)")
    p.add_argument("--subnet", default="10.78.0")
    p.add_argument("--timeout_s", type=int, default=3600, help="bound on each PS job")
    p.add_argument("--allreduce_timeout_s", type=int, default=300,
                   help="bound on the allreduce job, which must refuse within seconds; a launch "
                        "that hangs (an orted that never reports, seen under load) is retried once")
    p.add_argument("--set", action="append", default=[], metavar="A.B=V",
                   help="more config overrides for every run (e.g. cluster.consistency=BOUNDED)")
    p.add_argument("--keep_checkpoints", action="store_true",
                   help="keep the PS runs' checkpoints (a chain of ~100 deltas: 4-7 GB each at the "
                        "default size); by default they are removed once the run's summary is read")
    p.add_argument("--skip_data", action="store_true", help="reuse WORK/train and WORK/test")
    p.add_argument("--skip_single", action="store_true", help="reuse WORK/single's summary")
    return p.parse_args(argv)


def log(msg):
    print(f"[oversized_model {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, out_path, timeout_s, during=None):
    """Runs cmd with its output into out_path, calling during() about once a second while it
    runs; returns (exit status, seconds)."""
    log(" ".join(cmd) + f"  > {out_path}")
    start = time.time()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        code = None
        while code is None:
            try:
                code = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                if time.time() - start > timeout_s + 120:
                    proc.terminate()  # emulate_hosts.sh removes its hosts on SIGTERM
                    proc.wait(timeout=120)
                    code = 124
                elif during:
                    during()
    return code, time.time() - start


class AnonPeaks:
    """The peak anonymous memory (resident, not page cache) of each emulated host, sampled from
    its memory cgroup's memory.stat (v1 total_rss, v2 anon) once a second. hosts.json's peak is
    the cgroup's max usage, which counts the page cache of the data and checkpoint files too (v1):
    under a cap it reaches the cap as soon as the files fill the cache, and tells nothing."""

    def __init__(self, emulate_log, hosts):
        self.log, self.hosts, self.peaks, self.dirs = emulate_log, hosts, [None] * hosts, None

    def __call__(self):
        if self.dirs is None:
            try:
                with open(self.log) as f:
                    m = re.search(r"a cgroup per host \((\S+)-h\*\)", f.read())
            except OSError:
                m = None
            if not m:
                return
            self.dirs = [f"{m.group(1)}-h{i}" for i in range(self.hosts)]
        for i, d in enumerate(self.dirs):
            try:
                with open(os.path.join(d, "memory.stat")) as f:
                    stat = dict(line.split() for line in f if len(line.split()) == 2)
            except OSError:
                continue
            anon = int(stat.get("total_rss", stat.get("anon", 0))) / MIB
            self.peaks[i] = max(self.peaks[i] or 0, anon)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ensure_binary(args):
    if os.access(args.binary, os.X_OK):
        return
    if args.binary != os.path.join(SOURCE_ROOT, "build/release/pstrain"):
        sys.exit(f"oversized_model: no pstrain at {args.binary}")
    log("no build/release/pstrain: building it (scripts/build.sh release)")
    subprocess.run(["bash", os.path.join(SOURCE_ROOT, "scripts/build.sh"), "release"], check=True)


def make_data(args):
    common = ["--teacher_seed", "15", "--high_cardinality_fields", args.high_cardinality_fields,
              "--high_cardinality", str(args.high_cardinality),
              "--high_cardinality_zipf_exponent", str(args.high_cardinality_zipf_exponent)]
    for name, rows, seed, files in (("train", args.rows, 1, args.files),
                                    ("test", args.test_rows, 2, 1)):
        d = os.path.join(args.work, name)
        shutil.rmtree(d, ignore_errors=True)
        code, _ = run([args.binary, "datagen", "--rows", str(rows), "--seed", str(seed),
                       "--files", str(files), "--out", d] + common,
                      os.path.join(args.work, f"datagen_{name}.log"), args.timeout_s)
        if code != 0:
            sys.exit(f"oversized_model: datagen failed (log {args.work}/datagen_{name}.log)")


def write_fragment(args):
    """The config fragment: the wide fields' vocabularies."""
    vocab = args.wide_vocab or args.rows
    lines = ["# written by scripts/oversized_model.py",
             f"features {{ categorical_vocab_size: {args.categorical_vocab}"]
    for name in args.high_cardinality_fields.split(","):
        lines.append(f"  field {{ name: \"{name}\" vocab_size: {vocab} }}")
    lines.append("}")
    path = os.path.join(args.work, "oversized.textproto")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def training_flags(args, fragment, towers):
    flags = ["--config", args.config, "--config", fragment,
             "--train", os.path.join(args.work, "train/part-*"),
             "--eval", os.path.join(args.work, "test/part-*"),
             "--set", "checkpoint.every_seconds=0",
             "--set", f"threads.towers={towers}", "--set", "threads.intra_op_threads=1"]
    for s in args.set:
        flags += ["--set", s]
    return flags


def memory_parts(summary):
    """Per part (process, shard or rank): (params + slots bytes, everything the stores hold)."""
    m = (summary or {}).get("memory") or {}
    params, slots = m.get("parameter_bytes") or [], m.get("optimizer_bytes") or []
    total = m.get("total_bytes") or [None] * len(params)
    return [(p + s, t) for p, s, t in zip(params, slots, total)]


def emulated(args, n, cap_mb, mode, run_dir, flags, timeout_s):
    os.makedirs(run_dir, exist_ok=True)
    model = os.path.join(run_dir, "model")
    work = os.path.join(run_dir, "hosts")
    shutil.rmtree(model, ignore_errors=True)
    cmd = ["bash", os.path.join(SOURCE_ROOT, "scripts/emulate_hosts.sh"), "--hosts", str(n),
           "--memory_mb", str(cap_mb), "--tag", f"{args.tag}{n}{mode[0]}", "--subnet", args.subnet,
           "--binary", args.binary, "--work", work, "--timeout_s", str(timeout_s),
           "run", mode, "--"] + flags + ["--model_dir", model]
    peaks = AnonPeaks(os.path.join(run_dir, "emulate_hosts.log"), n)
    code, secs = run(cmd, os.path.join(run_dir, "emulate_hosts.log"), timeout_s, peaks)
    logs = ""
    for name in sorted(os.listdir(work)) if os.path.isdir(work) else []:
        if name.endswith(".log"):
            with open(os.path.join(work, name), errors="replace") as f:
                logs += f.read()
    with open(os.path.join(run_dir, "emulate_hosts.log"), errors="replace") as f:
        logs += f.read()
    hosts = read_json(os.path.join(work, "hosts.json")) or {}
    if not args.keep_checkpoints and os.path.isdir(model):
        for name in os.listdir(model):
            if name.startswith("ckpt-"):
                shutil.rmtree(os.path.join(model, name), ignore_errors=True)
    return {"code": code, "seconds": secs, "summary": read_json(os.path.join(model, "summary.json")),
            "hosts": hosts.get("hosts") or [], "memory_cap": hosts.get("memory_cap"),
            "anon_peaks_mb": peaks.peaks,
            "oom_killed": bool(re.search(r"exited with 137|signal 9|Killed", logs)), "logs": logs}


def main(argv):
    args = parse_args(argv)
    args.work = os.path.abspath(args.work)
    os.makedirs(args.work, exist_ok=True)
    ensure_binary(args)
    hosts = [int(h) for h in args.hosts.split(",") if h]  # "": allreduce only
    if any(args.files % n for n in hosts):
        sys.exit(f"oversized_model: --files {args.files} must be a multiple of every --hosts")
    if not args.skip_data:
        make_data(args)
    fragment = write_fragment(args)

    # The reference: one process, no cap.
    single_dir = os.path.join(args.work, "single")
    if not args.skip_single:
        shutil.rmtree(single_dir, ignore_errors=True)
        code, secs = run([args.binary, "train"] + training_flags(args, fragment, args.train_towers) +
                         ["--model_dir", single_dir],
                         os.path.join(args.work, "single.log"), args.timeout_s)
        if code != 0:
            sys.exit(f"oversized_model: the single-process run failed ({args.work}/single.log)")
    single = read_json(os.path.join(single_dir, "summary.json"))
    if single is None:
        sys.exit(f"oversized_model: no {single_dir}/summary.json")
    model_bytes = memory_parts(single)[0][0]
    cap_mb = int(model_bytes / args.ratio / MIB)
    log(f"model (params + slots of the single run): {model_bytes / MIB:.1f} MB; "
        f"cap per host: {cap_mb} MB (model / {args.ratio:g})")

    rows = [{"run": "train (1 process, uncapped)", "hosts": 1, "status": "ok",
             "test_auc": single.get("test_auc"), "parts_mb": [model_bytes / MIB],
             "store_mb": [t / MIB for _, t in memory_parts(single) if t],
             "peaks_mb": [], "examples_per_sec": single.get("examples_per_sec"),
             "wall_seconds": single.get("wall_seconds")}]
    ok = True
    # A PS checkpoint COPYs every shard's rows into memory before writing them (docs/CHECKPOINT.md),
    # so a full checkpoint doubles a shard: with 2 hosts, M / 2 twice is over the cap M / 1.5.
    # Incremental checkpoints every K steps copy only the rows updated since the last one (the
    # first, full one is taken while the model is still small), the final one included.
    flags = training_flags(args, fragment, 1) + [
        "--set", f"checkpoint.every_steps={args.checkpoint_every_steps}",
        "--set", "checkpoint.incremental_every=1000000",
        # 4 partitions a shard (the default) are contiguous row ranges, and the wide fields'
        # ranges are few and large: 64 spread them (shard imbalance 1.02 against 1.8 at 4 hosts).
        "--set", "cluster.num_partitions=64"]
    for n in hosts:
        r = emulated(args, n, cap_mb, "ps", os.path.join(args.work, f"ps{n}"), flags,
                     args.timeout_s)
        s = r["summary"] or {}
        status = "ok" if r["code"] == 0 and r["summary"] else (
            "OOM-killed" if r["oom_killed"] else f"failed ({r['code']})")
        gap = (s["test_auc"] - single["test_auc"]
               if s.get("test_auc") is not None and single.get("test_auc") is not None else None)
        ok = ok and status == "ok" and gap is not None and abs(gap) <= args.auc_tolerance
        rows.append({"run": f"{s.get('mode', 'ps')} on {n} hosts", "hosts": n, "status": status,
                     "test_auc": s.get("test_auc"), "gap": gap,
                     "parts_mb": [b / MIB for b, _ in memory_parts(s)],
                     "store_mb": [t / MIB for _, t in memory_parts(s) if t],
                     "peaks_mb": [h.get("peak_memory_mb") for h in r["hosts"]],
                     "anon_peaks_mb": r["anon_peaks_mb"],
                     "examples_per_sec": s.get("examples_per_sec"),
                     "wall_seconds": s.get("wall_seconds"), "memory_cap": r["memory_cap"]})

    # Allreduce under the same cap: must refuse at startup.
    for attempt in (1, 2):
        r = emulated(args, 2, cap_mb, "allreduce", os.path.join(args.work, "allreduce2"),
                     training_flags(args, fragment, 1), args.allreduce_timeout_s)
        refused = "the model does not fit" in r["logs"]
        if refused or r["code"] != 124:
            break
        log(f"allreduce: no answer within {args.allreduce_timeout_s} s (attempt {attempt})")
    ok = ok and refused and r["code"] != 0 and not r["oom_killed"]
    estimate = re.search(r"each rank's replica: about (\d+) MB expected", r["logs"])
    rows.append({"run": "allreduce on 2 hosts", "hosts": 2,
                 "status": ("refused at startup" if refused else "OOM-killed" if r["oom_killed"]
                            else "timed out" if r["code"] == 124 else f"exit {r['code']}"),
                 "test_auc": None, "parts_mb": [], "store_mb": [],
                 "replica_estimate_mb": int(estimate.group(1)) if estimate else None,
                 "peaks_mb": [h.get("peak_memory_mb") for h in r["hosts"]],
                 "anon_peaks_mb": r["anon_peaks_mb"], "examples_per_sec": None, "wall_seconds": r["seconds"]})

    report = {"model_bytes": model_bytes, "cap_mb": cap_mb, "ratio": args.ratio,
              "train_rows": args.rows, "test_rows": args.test_rows,
              "high_cardinality_fields": args.high_cardinality_fields,
              "wide_vocab": args.wide_vocab or args.rows, "single": single_dir, "runs": rows,
              "ok": ok}
    with open(os.path.join(args.work, "oversized.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(args.work, "oversized.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0 if ok else 1


def markdown(report):
    def f(v, spec=".0f"):
        return "" if v is None else format(v, spec)

    def many(vs, spec=".0f"):
        return ", ".join(f(v, spec) if v is not None else "n/a" for v in vs)

    lines = [f"Model: {report['model_bytes'] / MIB:.1f} MB of parameters + optimizer slots "
             f"(the single run's summary.json); cap per host: {report['cap_mb']} MB "
             f"(model / {report['ratio']:g}).", "",
             "| run | status | test AUC | gap to train | params + slots MB per shard | store MB "
             "per shard | anonymous peak MB per host | cgroup peak MB per host | ex/s |",
             "|" + "---|" * 9]
    for r in report["runs"]:
        store = many(r["store_mb"])
        if r.get("replica_estimate_mb") is not None:
            store = f"replica estimate {r['replica_estimate_mb']} per rank"
        lines.append(f"| {r['run']} | {r['status']} | {f(r['test_auc'], '.5f')} | "
                     f"{f(r.get('gap'), '+.4f')} | {many(r['parts_mb'])} | {store} | "
                     f"{many(r.get('anon_peaks_mb') or [])} | {many(r['peaks_mb'])} | "
                     f"{f(r['examples_per_sec'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
