#!/usr/bin/env python3
"""bench/compare: one command, one report comparing pstrain's training strategies.

Runs the same config, data and epochs as
  train        single-process `pstrain train`
  ps-async     `pstrain local --hosts N --set cluster.consistency=ASYNC`
  ps-bounded   ... BOUNDED
  ps-sync      ... SYNC
  allreduce    `mpirun --allow-run-as-root --oversubscribe -np N pstrain allreduce ...`
--repeats times (each repeat runs every mode once, so ratios to `train` are taken within one
repeat), and writes results/<timestamp>/compare.json, compare.md and compare.png (gnuplot).
With --emulate_hosts the PS and allreduce modes run across N emulated hosts instead
(scripts/emulate_hosts.sh: a network namespace, a tc-capped link and a memory cgroup per host),
the report adds each host's peak memory, its link's bytes and CPU from the hosts' cgroups, and
the scaling model's prediction for that point (bench/emulated_scaling.py runs a grid).

A mode whose command fails is reported as failed with the first line of its error; the script
exits 1 when a mode not listed in --allow_fail failed.

Measurement: every run is a child process tree (its own session). CPU utilisation is the
rusage of the reaped tree (user + sys, os.wait4: includes every descendant the launcher reaped)
divided by wall time and by the cores of this machine. Peak memory is the largest sum of VmRSS
over the tree, sampled every 0.2 s from /proc, or the largest single process's max RSS from
rusage if that is larger (sampling can miss a short peak). Bytes per example: summary.json's
wire_bytes when present, else the PS shard balance table the chief prints (in_MB + out_MB over
the shards: every byte received or sent by a shard, loopback included), else n/a; 0 for
single-process training. Time to target AUC: wall time from the launch to the first eval line in
<model_dir>/metrics.jsonl whose eval_auc reaches the target (periodic evals need
--set train.eval_every_steps=K, otherwise only the final eval counts).

Only the Python standard library is used; the plot needs gnuplot (scripts/install_bench_deps.sh,
run automatically with --install_deps when gnuplot is missing).
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

MODES = ["train", "ps-async", "ps-bounded", "ps-sync", "allreduce"]
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default=os.path.join(SOURCE_ROOT, "build/release/pstrain"))
    p.add_argument("--config", action="append", default=[], help="config file(s), in order")
    p.add_argument("--train", action="append", default=[], help="training data paths")
    p.add_argument("--eval", action="append", default=[], help="evaluation data paths")
    p.add_argument("--format", default="")
    p.add_argument("--epochs", type=int, default=0, help="0 = from the config")
    p.add_argument("--set", action="append", default=[], help="config override for every mode")
    p.add_argument("--hosts", type=int, default=2, help="hosts (PS) and ranks (allreduce)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", default="results", help="results/<timestamp>/ goes here")
    p.add_argument("--target_auc", type=float, default=0.0,
                   help="AUC for time-to-target (0 = 0.99 x the single-process final AUC)")
    p.add_argument("--network_gbps", type=float, default=25.0,
                   help="network of the scaling model, Gb/s per host per direction")
    p.add_argument("--ps_link_efficiency", type=float, default=0.55,
                   help="share of the link rate the PS's traffic reaches in the scaling model "
                        "(measured on 2/4/8 emulated hosts at 100 Mbit/s: 0.90/0.54/0.52; "
                        "docs/PERFORMANCE.md \"Emulated hosts\")")
    p.add_argument("--allreduce_link_efficiency", type=float, default=0.55,
                   help="share of the link rate allreduce's collectives reach in the scaling "
                        "model (measured there: 0.55/0.57/0.48)")
    p.add_argument("--timeout_s", type=float, default=3600, help="per run")
    p.add_argument("--allow_fail", default="",
                   help="modes that may fail without failing the comparison (not yet available)")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=MODE:KEY=VALUE[;KEY=VALUE...]: one more mode, MODE run with these "
                        "config overrides (e.g. ps-async-k2=ps-async:cluster.dense_sync_steps=2), "
                        "measured in the same repeats as the others")
    p.add_argument("--emulate_hosts", action="store_true",
                   help="run the PS and allreduce modes across --hosts emulated hosts "
                        "(scripts/emulate_hosts.sh: a network namespace per host, tc-capped links, "
                        "a memory cgroup per host; needs root); `train` stays one plain process")
    p.add_argument("--emulate_mbit", type=float, default=0,
                   help="with --emulate_hosts: each host's link, Mbit/s per direction (0 = uncapped)")
    p.add_argument("--emulate_memory_mb", type=int, default=0,
                   help="with --emulate_hosts: each host's memory cap, MB (0 = uncapped)")
    p.add_argument("--install_deps", action="store_true",
                   help="run scripts/install_bench_deps.sh when gnuplot is missing")
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes + [m for m in args.allow_fail.split(",") if m]:
        if m not in MODES:
            p.error(f"unknown mode '{m}' (modes: {', '.join(MODES)})")
    args.variants = {}
    for v in args.variant:
        m = re.fullmatch(r"([\w.-]+)=([\w-]+):(.+)", v)
        if not m or m.group(2) not in MODES or m.group(1) in MODES or m.group(1) in args.variants:
            p.error(f"--variant '{v}': expected NEW_NAME=MODE:KEY=VALUE[;KEY=VALUE...] with MODE "
                    f"one of {', '.join(MODES)}")
        args.variants[m.group(1)] = (m.group(2), m.group(3).split(";"))
        args.modes.append(m.group(1))
    return args


def base_mode(args, mode):
    """The pstrain mode a (variant) mode runs."""
    return args.variants.get(mode, (mode, []))[0]


def cores():
    return len(os.sched_getaffinity(0))


def training_flags(args, model_dir):
    f = []
    for c in args.config:
        f += ["--config", c]
    for t in args.train:
        f += ["--train", t]
    for e in args.eval:
        f += ["--eval", e]
    if args.format:
        f += ["--format", args.format]
    if args.epochs:
        f += ["--epochs", str(args.epochs)]
    for s in args.set:
        f += ["--set", s]
    return f + ["--model_dir", model_dir]


def emulated(args, kind, run_dir):
    """scripts/emulate_hosts.sh's command line for a `kind` (ps or allreduce) job."""
    return [os.path.join(SOURCE_ROOT, "scripts/emulate_hosts.sh"), "--hosts", str(args.hosts),
            "--mbit", f"{args.emulate_mbit:g}", "--memory_mb", str(args.emulate_memory_mb),
            "--binary", args.binary, "--work", os.path.join(run_dir, "hosts"),
            "--timeout_s", str(int(args.timeout_s)), "run", kind, "--"]


def command(args, mode, model_dir, run_dir=""):
    mode, extra = args.variants.get(mode, (mode, []))
    flags = training_flags(args, model_dir)
    for s in extra:
        flags += ["--set", s]
    if mode == "train":
        return [args.binary, "train"] + flags
    if mode.startswith("ps-"):
        consistency = ["--set", f"cluster.consistency={mode[3:].upper()}"]
        if args.emulate_hosts:
            return emulated(args, "ps", run_dir) + flags + consistency
        return [args.binary, "local", "--hosts", str(args.hosts)] + flags + consistency
    if args.emulate_hosts:
        return emulated(args, "allreduce", run_dir) + flags
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.hosts),
            args.binary, "allreduce"] + flags


def host_stats(summary, run_dir):
    """(params + optimizer MB of the largest part, from summary.json "memory"; with
    --emulate_hosts, from the script's hosts.json: the largest host's cgroup peak MB, the mean
    bytes a host's link carried out and the CPU seconds of all hosts, else None)."""
    m = summary.get("memory") or {}
    parts = [a + b for a, b in zip(m.get("parameter_bytes", []), m.get("optimizer_bytes", []))]
    params = max(parts) / 1e6 if parts else None
    peak = tx = cpu = None
    try:
        with open(os.path.join(run_dir, "hosts", "hosts.json")) as f:
            hosts = json.load(f)["hosts"]
        peaks = [h["peak_memory_mb"] for h in hosts
                 if isinstance(h.get("peak_memory_mb"), (int, float))]
        peak = max(peaks) if peaks else None
        txs = [h["tx_bytes"] for h in hosts if isinstance(h.get("tx_bytes"), (int, float))]
        tx = statistics.mean(txs) if txs else None
        cpus = [h.get("cpu_seconds") for h in hosts]
        cpu = sum(cpus) if all(isinstance(c, (int, float)) for c in cpus) else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return params, peak, tx, cpu


def tree_rss_kb(root):
    """Summed VmRSS (kB) of `root` and its descendants, from /proc."""
    children, rss = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/status") as f:
                m = re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M)
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
        rss[int(pid)] = int(m.group(1)) if m else 0
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack += children.get(p, [])
    return total


def first_error_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for l in lines:
        if re.search(r"pstrain[^:]*:|error|Error|ERROR|unknown|not implemented|failed", l):
            return l
    return lines[-1] if lines else "no output"


def cpu_times():
    """The machine's aggregate CPU times from /proc/stat (user ... steal), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return [int(x) for x in fields[1:9]] if fields[0] == "cpu" else None
    except (OSError, ValueError, IndexError):
        return None


def steal_fraction(before, after):
    """Share of the machine's CPU time the hypervisor gave to other guests between two
    cpu_times() readings (the 8th field, steal), or None."""
    if before is None or after is None:
        return None
    d = [b - a for a, b in zip(before, after)]
    return d[7] / sum(d) if sum(d) > 0 else None


def run_one(args, mode, run_dir):
    """Runs one mode once; returns a dict of measurements (status 'ok' or 'failed')."""
    model_dir = os.path.join(run_dir, "model")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    cmd = command(args, mode, model_dir, run_dir)
    out_path, err_path = os.path.join(run_dir, "stdout.log"), os.path.join(run_dir, "stderr.log")
    r = {"mode": mode, "command": " ".join(cmd), "log": err_path}
    launch = time.time()
    stat_before = cpu_times()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        except OSError as e:
            return dict(r, status="failed", error=f"{cmd[0]}: {e.strerror}")
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.wait(0.2):
                peak[0] = max(peak[0], tree_rss_kb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        timer = threading.Timer(args.timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.time() - launch
        timer.cancel()
        done.set()
        sampler.join()
        try:  # stragglers of the tree (the launchers kill their children; this is a backstop)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    code = os.waitstatus_to_exitcode(status)
    cpu_seconds = usage.ru_utime + usage.ru_stime
    # Emulated hosts: their cgroups' CPU time counts the processes the reaped tree misses
    # (mpirun's orted daemons and their ranks are not its descendants).
    if args.emulate_hosts and mode != "train":
        host_cpu = host_stats({}, run_dir)[3]
        if host_cpu is not None:
            cpu_seconds = max(cpu_seconds, host_cpu)
    r.update(wall_seconds=wall, exit_code=code, cpu_seconds=cpu_seconds,
             steal=steal_fraction(stat_before, cpu_times()),
             cpu_utilisation=cpu_seconds / wall / cores(),
             peak_memory_mb=max(peak[0], usage.ru_maxrss) / 1024.0)
    with open(err_path) as f:
        stderr = f.read()
    summary_path = os.path.join(model_dir, "summary.json")
    if code != 0 or not os.path.exists(summary_path):
        reason = first_error_line(stderr) if code != 0 else "no summary.json written"
        if code < 0:
            reason = f"killed by signal {-code} (timeout {args.timeout_s:.0f} s?): {reason}"
        return dict(r, status="failed", error=reason)
    with open(summary_path) as f:
        s = json.load(f)
    # A run that is not the mode asked for (a binary without it) is not a result for that mode.
    if s.get("mode") != base_mode(args, mode):
        return dict(r, status="failed",
                    error=f"ran as {s.get('mode')}, not {base_mode(args, mode)}")
    r.update(status="ok", summary=s, launch_time=launch,
             examples_per_sec=s.get("examples_per_sec"), test_auc=s.get("test_auc"),
             test_logloss=s.get("test_logloss"), examples=s.get("examples"))
    r["examples_per_sec_per_core"] = r["examples_per_sec"] / cores()
    r["param_memory_mb_per_host"], r["host_peak_memory_mb"], tx, _ = host_stats(s, run_dir)
    # What a host's link carried out per step of its worker, by the counters (summary "steps":
    # the sum over the PS workers; the job's steps for allreduce, whose ranks step together).
    host_steps = s.get("steps", 0) / (args.hosts if base_mode(args, mode).startswith("ps-") else 1)
    r["link_bytes_per_host_step"] = tx / host_steps if tx and host_steps else None
    # CPU time of the whole run (start-up and evaluation included) per trained example: unlike
    # ex/s, it barely moves when the hypervisor steals time (which is not charged to us).
    r["cpu_us_per_example"] = cpu_seconds / max(1, r["examples"]) * 1e6
    bytes_total, method = None, "n/a"
    if "wire_bytes" in s:
        bytes_total, method = s["wire_bytes"], "summary wire_bytes"
    elif mode == "train":
        bytes_total, method = 0, "none (one process)"
    table = re.search(r"PS shard balance:\n.*?\n((?:\d+\s.*\n?)+)", stderr)
    shard_rows = [l.split() for l in table.group(1).splitlines() if l.strip()] if table else []
    # Per shard: pull and push requests per second over the shard's uptime (the balance table).
    r["shard_qps"] = [[float(c[4]), float(c[5])] for c in shard_rows]
    if bytes_total is None and shard_rows:
        bytes_total = sum((float(c[6]) + float(c[7])) * 1e6 for c in shard_rows)
        method = "shard stats in+out"
    r["bytes_per_example"] = bytes_total / s["examples"] if bytes_total is not None and s.get(
        "examples") else None
    r["bytes_method"] = method
    r["eval_curve"] = []
    metrics = os.path.join(model_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if "eval_auc" in j:
                    r["eval_curve"].append([j["wall_time"] - launch, j["eval_auc"]])
    return r


def median(values):
    v = [x for x in values if isinstance(x, (int, float))]
    return statistics.median(v) if v else None


def traffic_per_host_step(n, b_ps, U, k, D):
    """Bytes per host per direction per step (PS, allreduce) at n hosts; see scaling()."""
    return (n - 1) / n * b_ps, 2 * (n - 1) / n * 4 * D + (n - 1) * U * (8 + 4 * k)


def scaling(train, ps, allreduce_row, gbps, ps_hosts, hosts_list=(2, 4, 8, 16, 32, 128),
            emulated=None, efficiency=(1.0, 1.0)):
    """Examples/s on paper for N hosts from the single-process step time and the traffic model.

    A host is this machine. Step time = compute + traffic / (bandwidth x efficiency) (no
    overlap: conservative for both). Compute per host step = the single-process step, for the PS
    x its measured CPU per example against `train` (its "CPU vs train": RPCs, serialization and
    the shards' updates; 1 when not measured); the emulated runs showed that leaving it out
    overstates the PS by 1.5-2.4x (docs/PERFORMANCE.md "Emulated hosts"). `efficiency` (PS,
    allreduce): the share of the link rate each reaches (the same runs at 100 Mbit/s: the PS
    0.52-0.90, allreduce 0.48-0.57). Per host, per direction and per step:
      PS:        (N-1)/N x B_ps, B_ps = the worker's pull+push bytes per step to all shards
                 (measured: bytes/example x batch x H/(H-1), since the H-host run's messages
                 leave out each worker's direct calls to its own shard; or U(16+8k) + 8D from
                 the sizes): its worker's remote traffic plus the requests its shard serves for
                 the others.
      allreduce: ring allreduce of the dense gradient 2(N-1)/N x 4D, plus the allgather of
                 every other rank's (id, gradient) rows (N-1) x U(8+4k).
    `emulated` ({"hosts": N, "mbit": M, "cores": C, "threads_per_host": T}): also the prediction
    for N emulated hosts on this machine (scripts/emulate_hosts.sh), where the N hosts share its
    C cores: compute per step x max(1, N x T / C), links of M Mbit/s (0: no network term).
    """
    s = train["summary"]
    # The examples of a step (train.global_batch_size's share, else towers x batch_size).
    batch = s.get("step_batch") or s["towers"] * s["batch_size_per_tower"]
    step_s = batch / train["examples_per_sec"]
    U, k, D = s.get("unique_rows_per_step"), s.get("row_dim"), s.get("dense_params")
    if not (U and k and D):
        return None
    bw = gbps * 1e9 / 8
    if ps and ps.get("bytes_per_example") and ps_hosts > 1:
        b_ps = ps["bytes_per_example"] * batch * ps_hosts / (ps_hosts - 1)
        b_ps_source = f"measured (ps-async, x {ps_hosts}/{ps_hosts - 1} for the local shard)"
    else:
        b_ps, b_ps_source = U * (16 + 8 * k) + 8 * D, "from the sizes"
    ps_cpu = (ps or {}).get("cpu_ratio_to_train") or 1.0
    # Not allreduce's: OpenMPI busy-polls while a collective waits, so its CPU time grows with
    # the network's wait (20x train's per example on 8 emulated hosts at 100 Mbit/s) and is no
    # measure of its work.
    ar_cpu = 1.0
    e_ps, e_ar = efficiency
    rows = []
    for n in hosts_list:
        ps_bytes, ar_bytes = traffic_per_host_step(n, b_ps, U, k, D)
        rows.append({"hosts": n,
                     "ps_examples_per_sec": n * batch / (step_s * ps_cpu + ps_bytes / (bw * e_ps)),
                     "allreduce_examples_per_sec":
                         n * batch / (step_s * ar_cpu + ar_bytes / (bw * e_ar)),
                     "ps_bytes_per_step": ps_bytes, "allreduce_bytes_per_step": ar_bytes})
    # Where the traffic crosses: (N-1)/N b_ps = 2(N-1)/N 4D + (N-1) U(8+4k)  <=>  (b_ps - 8D)/N =
    # U(8+4k)  <=>  N = (b_ps - 8D) / (U(8+4k)).
    cross = (b_ps - 8 * D) / (U * (8 + 4 * k))
    out = {"network_gbps": gbps, "batch_per_host_step": batch, "compute_seconds_per_step": step_s,
           "unique_rows_per_step": U, "row_dim": k, "dense_params": D, "ps_bytes_per_step_source":
           b_ps_source, "ps_worker_bytes_per_step": b_ps, "traffic_cross_hosts": cross,
           "ps_cpu_ratio": ps_cpu, "allreduce_cpu_ratio": ar_cpu, "ps_link_efficiency": e_ps,
           "allreduce_link_efficiency": e_ar, "rows": rows}
    if emulated:
        n = emulated["hosts"]
        cpu_factor = max(1.0, n * emulated["threads_per_host"] / emulated["cores"])
        link = emulated["mbit"] * 1e6 / 8 if emulated["mbit"] > 0 else float("inf")
        ps_bytes, ar_bytes = traffic_per_host_step(n, b_ps, U, k, D)
        compute = step_s * cpu_factor
        out["emulated"] = dict(
            emulated, cpu_factor=cpu_factor, compute_seconds_per_step=compute,
            ps_network_seconds_per_step=ps_bytes / (link * e_ps),
            allreduce_network_seconds_per_step=ar_bytes / (link * e_ar),
            ps_examples_per_sec=n * batch / (compute * ps_cpu + ps_bytes / (link * e_ps)),
            allreduce_examples_per_sec=n * batch / (compute * ar_cpu + ar_bytes / (link * e_ar)),
            ps_bytes_per_step=ps_bytes, allreduce_bytes_per_step=ar_bytes,
            measured_ps_examples_per_sec=(ps or {}).get("examples_per_sec"),
            measured_allreduce_examples_per_sec=(allreduce_row or {}).get("examples_per_sec"),
            measured_ps_bytes_per_step=(ps or {}).get("link_bytes_per_host_step"),
            measured_allreduce_bytes_per_step=(allreduce_row or {}).get(
                "link_bytes_per_host_step"))
    return out


def fmt(v, spec=".0f"):
    return "n/a" if v is None else format(v, spec)


def fmt_range(r, spec):
    return "n/a" if not r else f"{format(r[0], spec)}-{format(r[1], spec)}"


def write_markdown(report, path):
    L = [f"# bench/compare, {report['timestamp']}", "",
         f"Machine: {report['cores']} cores. Command: `{report['command']}`", "",
         f"Repeats: {report['repeats']} (medians; ratios to `train` within each repeat). "
         f"Target AUC: {fmt(report['target_auc'], '.4f')}.", "",
         (f"Hosts: {report['hosts']} emulated hosts (scripts/emulate_hosts.sh), links "
          f"{e['mbit']:g} Mbit/s per direction (0 = uncapped), memory {e['memory_mb']} MB per "
          "host (0 = uncapped), all on this machine's cores; `train` is one plain process."
          if (e := report.get("emulation")) else
          f"Hosts: {report['hosts']} on loopback (`pstrain local`, mpirun --oversubscribe)."), "",
         "| mode | status | ex/s (range) | ex/s per core | vs train | test AUC (range) | logloss |"
         " bytes/example |"
         " time to target (s) | CPU util | CPU µs/example | CPU vs train | steal |"
         " peak mem (MB) | params+opt MB per host | host peak MB | shard pull/push QPS |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in report["modes"]:
        if m["status"] == "failed":
            L.append(f"| {m['mode']} | failed: {m['error']} |" + " |" * 15)
            continue
        L.append(f"| {m['mode']} | {m['status']} | {fmt(m['examples_per_sec'])} "
                 f"({fmt_range(m.get('examples_per_sec_range'), '.0f')}) | "
                 f"{fmt(m['examples_per_sec_per_core'])} | {fmt(m['ratio_to_train'], '.2f')} | "
                 f"{fmt(m['test_auc'], '.4f')} ({fmt_range(m.get('test_auc_range'), '.4f')}) | "
                 f"{fmt(m['test_logloss'], '.4f')} | "
                 f"{fmt(m['bytes_per_example'], '.0f')} ({m['bytes_method']}) | "
                 f"{fmt(m['time_to_target_s'], '.1f')} | {fmt(m['cpu_utilisation'], '.2f')} | "
                 f"{fmt(m['cpu_us_per_example'], '.1f')} | {fmt(m['cpu_ratio_to_train'], '.2f')} | "
                 f"{fmt(m['steal'], '.0%')} | "
                 f"{fmt(m['peak_memory_mb'], '.0f')} | "
                 f"{fmt(m.get('param_memory_mb_per_host'), '.1f')} | "
                 f"{fmt(m.get('host_peak_memory_mb'), '.0f')} | "
                 + (", ".join(f"{a:.0f}/{b:.0f}" for a, b in m.get("shard_qps") or []) or "-")
                 + " |")
    L += ["", "Methods: " + report["methods"], ""]
    sc = report.get("scaling")
    if sc:
        L += [f"## Scaling on paper ({sc['network_gbps']:g} Gb/s per host)", "",
              f"From the single-process run: {sc['batch_per_host_step']} examples per host step, "
              f"{sc['compute_seconds_per_step'] * 1e3:.1f} ms compute per step, "
              f"{sc['unique_rows_per_step']:.0f} unique rows of {sc['row_dim']} floats per step, "
              f"{sc['dense_params']} dense floats; PS worker bytes per step "
              f"{sc['ps_worker_bytes_per_step'] / 1e6:.2f} MB ({sc['ps_bytes_per_step_source']}). "
              "Step time = compute (for the PS x its CPU per example against `train`, "
              f"{sc['ps_cpu_ratio']:.2f}; 1 when not measured) + bytes per host per direction / "
              "(bandwidth x link efficiency: PS "
              f"{sc['ps_link_efficiency']:g}, allreduce {sc['allreduce_link_efficiency']:g}), no "
              "overlap.", "",
              "| hosts | PS ex/s | allreduce ex/s | PS MB/step/host | allreduce MB/step/host |",
              "|---|---|---|---|---|"]
        for r in sc["rows"]:
            L.append(f"| {r['hosts']} | {r['ps_examples_per_sec']:.0f} | "
                     f"{r['allreduce_examples_per_sec']:.0f} | {r['ps_bytes_per_step'] / 1e6:.2f} | "
                     f"{r['allreduce_bytes_per_step'] / 1e6:.2f} |")
        c = sc["traffic_cross_hosts"]
        L += ["", (f"The traffic crosses at N = {c:.1f} hosts: below it allreduce moves fewer bytes "
                   "per host (its dense allreduce is O(model) but its sparse allgather grows as "
                   "N x the batch's rows); above it the PS (O(the batch's unique rows) per worker) "
                   "moves fewer." if c > 1 else
                   "The PS moves fewer bytes per host at every N >= 2 (allgathered sparse rows plus "
                   "the dense allreduce exceed the PS's pull+push of the batch's rows)."), ""]
    em = (sc or {}).get("emulated")
    if em:
        L += [f"## The model at this emulated point ({em['hosts']} hosts, {em['mbit']:g} Mbit/s)",
              "", f"The {em['hosts']} hosts share {em['cores']} cores: compute per step "
              f"{em['compute_seconds_per_step'] * 1e3:.1f} ms (x {em['cpu_factor']:.2f} the "
              f"single-process step); network per step: PS "
              f"{em['ps_network_seconds_per_step'] * 1e3:.1f} ms, allreduce "
              f"{em['allreduce_network_seconds_per_step'] * 1e3:.1f} ms.", "",
              "| strategy | measured ex/s | model ex/s | measured / model | link MB/step/host "
              "(counters) | model MB/step/host |", "|---|---|---|---|---|---|"]
        for name, key in (("ps-async", "ps"), ("allreduce", "allreduce")):
            meas, model = em[f"measured_{key}_examples_per_sec"], em[f"{key}_examples_per_sec"]
            link = em[f"measured_{key}_bytes_per_step"]
            L.append(f"| {name} | {fmt(meas)} | {fmt(model)} | "
                     f"{fmt(meas / model if meas and model else None, '.2f')} | "
                     f"{fmt(link / 1e6 if link else None, '.2f')} | "
                     f"{em[f'{key}_bytes_per_step'] / 1e6:.2f} |")
        L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def plot(report, out_dir):
    ok = [m for m in report["modes"] if m["status"] != "failed"]
    if not ok:
        return "no mode ran"
    dat = os.path.join(out_dir, "compare.dat")
    with open(dat, "w") as f:
        for i, m in enumerate(ok):
            eps, auc = m["examples_per_sec"] or 0, m["test_auc"] or 0
            eps_lo, eps_hi = m.get("examples_per_sec_range") or (eps, eps)
            auc_lo, auc_hi = m.get("test_auc_range") or (auc, auc)
            f.write(f"{i} \"{m['mode']}\" {eps} {auc} {eps_lo} {eps_hi} {auc_lo} {auc_hi}\n")
    # One block per mode; its first line is the title (columnheader).
    curves = os.path.join(out_dir, "curves.dat")
    with open(curves, "w") as f:
        for m in ok:
            f.write(f"\"{m['mode']}\"\n" + "".join(f"{t} {a}\n" for t, a in m["eval_curve"]) +
                    "\n\n")
    script = f"""set terminal pngcairo size 1400,450
set output '{os.path.join(out_dir, 'compare.png')}'
set multiplot layout 1,3
set style fill solid 0.6
set boxwidth 0.6
set bmargin 6
set xtics rotate by -35 left nomirror
set xrange [-0.6:{len(ok) - 0.4}]
set yrange [0:*]
set title 'examples/s (median; bars: range over {report["repeats"]} repeats)'
plot '{dat}' using 1:3:xtic(2) with boxes notitle, '' using 1:3:5:6 with yerrorbars lc 'black' pt -1 notitle
set title 'test AUC (median; bars: range)'
set yrange [*:*]
plot '{dat}' using 1:4:xtic(2) with boxes notitle, '' using 1:4:7:8 with yerrorbars lc 'black' pt -1 notitle
set title 'eval AUC vs time since launch (first repeat)'
set xtics norotate
set autoscale x
set xlabel 's'
plot for [i=0:{len(ok) - 1}] '{curves}' index i using 1:2 with linespoints title columnheader(1)
"""
    return run_gnuplot(script)


def run_gnuplot(script):
    """Runs a gnuplot script; None, or why no plot was made."""
    if not shutil.which("gnuplot"):
        return "gnuplot not found (scripts/install_bench_deps.sh installs it)"
    p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    return None if p.returncode == 0 else "gnuplot: " + first_error_line(p.stderr)


def main(argv):
    args = parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(os.path.join(args.results, stamp))
    os.makedirs(out_dir, exist_ok=True)
    runs = {m: [] for m in args.modes}
    for rep in range(args.repeats):
        for mode in args.modes:
            print(f"[compare] repeat {rep + 1}/{args.repeats}: {mode} ...", flush=True)
            r = run_one(args, mode, os.path.join(out_dir, "runs", f"{mode}-r{rep}"))
            if r["status"] == "ok":
                print(f"[compare]   {r['examples_per_sec']:.0f} ex/s, test AUC "
                      f"{r['test_auc']:.4f}, {r['wall_seconds']:.1f} s", flush=True)
            else:
                print(f"[compare]   failed: {r['error']} (log: {r['log']})", flush=True)
            runs[mode].append(r)
    base = [r for r in runs.get("train", []) if r["status"] == "ok"]
    target = args.target_auc or (0.99 * median([r["test_auc"] for r in base]) if base else None)
    modes = []
    for mode in args.modes:
        rs = runs[mode]
        good = [r for r in rs if r["status"] == "ok"]
        if not good:
            modes.append({"mode": mode, "status": "failed", "error": rs[0]["error"],
                          "command": rs[0]["command"]})
            continue
        ratios, cpu_ratios = [], []
        for i, r in enumerate(rs):
            t = runs["train"][i] if "train" in runs else None
            if r["status"] == "ok" and t and t["status"] == "ok":
                ratios.append(r["examples_per_sec"] / t["examples_per_sec"])
                cpu_ratios.append(r["cpu_us_per_example"] / t["cpu_us_per_example"])

        def ttt(r):
            hit = [t for t, a in r["eval_curve"] if target is not None and a >= target]
            return hit[0] if hit else None

        m = {"mode": mode, "status": "ok" if len(good) == len(rs) else
             f"{len(good)} of {len(rs)} runs ok", "command": good[0]["command"],
             "ratio_to_train": median(ratios), "cpu_ratio_to_train": median(cpu_ratios),
             "time_to_target_s": median([ttt(r) for r in good]),
             "bytes_method": good[0]["bytes_method"], "eval_curve": good[0]["eval_curve"],
             "shard_qps": good[0].get("shard_qps", []), "runs": len(good)}
        for key in ("examples_per_sec", "examples_per_sec_per_core", "test_auc", "test_logloss",
                    "bytes_per_example", "cpu_utilisation", "peak_memory_mb", "wall_seconds",
                    "cpu_us_per_example", "steal", "param_memory_mb_per_host",
                    "host_peak_memory_mb", "link_bytes_per_host_step"):
            m[key] = median([r.get(key) for r in good])
        for key in ("examples_per_sec", "test_auc"):  # the ranges over the repeats
            values = [r[key] for r in good if isinstance(r.get(key), (int, float))]
            m[key + "_range"] = [min(values), max(values)] if values else None
        modes.append(m)
    by_mode = {m["mode"]: m for m in modes}
    scaling_model = None
    if base:
        train_median = min(base, key=lambda r: abs(
            r["examples_per_sec"] - by_mode["train"]["examples_per_sec"]))
        emulated = None
        if args.emulate_hosts:
            t = train_median["summary"]
            emulated = {"hosts": args.hosts, "mbit": args.emulate_mbit, "cores": cores(),
                        "threads_per_host": t["towers"] * t["intra_op_threads"]}
        scaling_model = scaling(train_median, by_mode.get("ps-async"), by_mode.get("allreduce"),
                                args.network_gbps, args.hosts, emulated=emulated,
                                efficiency=(args.ps_link_efficiency,
                                            args.allreduce_link_efficiency))
    report = {
        "timestamp": stamp, "cores": cores(), "repeats": args.repeats, "hosts": args.hosts,
        "emulation": {"mbit": args.emulate_mbit, "memory_mb": args.emulate_memory_mb}
        if args.emulate_hosts else None,
        "command": " ".join(["python3", sys.argv[0]] + argv), "target_auc": target,
        "methods": ("ex/s from each run's summary.json; per core = ex/s / the machine's cores; "
                    "CPU util = (user+sys of the reaped process tree, os.wait4) / wall / cores; "
                    "CPU µs/example = that user+sys (start-up and evaluation included) / trained "
                    "examples, CPU vs train its ratio to train's within each repeat (robust to "
                    "time stolen by the hypervisor, which is not charged to the run); steal = "
                    "the machine's steal share of /proc/stat during the run; "
                    "peak memory = max over 0.2 s samples of the tree's summed VmRSS (or the "
                    "largest process's max RSS); params+opt MB per host = the largest part's "
                    "parameter + optimizer bytes of summary.json \"memory\" (a process, a PS "
                    "shard, an allreduce rank); host peak MB = the largest emulated host's cgroup "
                    "peak (--emulate_hosts); bytes/example as marked; time to target = launch "
                    "to the first eval in metrics.jsonl at or above the target AUC."),
        "modes": modes, "scaling": scaling_model, "runs": runs}
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    write_markdown(report, os.path.join(out_dir, "compare.md"))
    if not shutil.which("gnuplot") and args.install_deps:
        subprocess.run(["bash", os.path.join(SOURCE_ROOT, "scripts/install_bench_deps.sh")])
    note = plot(report, out_dir)
    if note:
        print(f"[compare] no plot: {note}")
    print(open(os.path.join(out_dir, "compare.md")).read())
    print(f"[compare] wrote {out_dir}/compare.json, compare.md" + ("" if note else ", compare.png"))
    allowed = set(a for a in args.allow_fail.split(",") if a)
    bad = [m["mode"] for m in modes if m["status"] == "failed" and m["mode"] not in allowed]
    if bad:
        print(f"[compare] failed modes: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
