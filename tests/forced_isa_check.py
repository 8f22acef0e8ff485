#!/usr/bin/env python3
"""Runs CTest's forced-ISA copies of one test binary as CTest registered them (command, filter,
environment and skip pattern, read from `ctest --show-only=json-v1`), on CPUs other than this
one, and checks that each copy skips or runs as its CPU demands:

- under QEMU's user-mode emulator as an AVX2-only CPU (-cpu Haswell: no AVX-512), every copy
  (isa_avx2, isa_avx512_core, isa_avx512_core_bf16) exits 0 with every test skipped, and the
  skip names the reason: the path is the CPU's best, or the CPU lacks the path's features;
- natively, the isa_avx2 copy runs its tests on the avx2 path (the test process says so; tests
  of what avx2 cannot do, bf16, skip with their own reason) where this CPU's best path is higher,
  and skips where avx2 is its best.

A copy that fails at setup instead, or runs a path the CPU lacks, fails this check: that is how
the suite once went red on an AMD EPYC Zen 3 (tests/test_main.cc says why).

usage: forced_isa_check.py BUILD_DIR BINARY_NAME [QEMU]
"""
import collections
import json
import os
import re
import subprocess
import sys

COPIES = ("isa_avx2", "isa_avx512_core", "isa_avx512_core_bf16")


def registered(build_dir, binary_name):
    """{prefix: (command without filter, env dict, skip regex, [gtest names])} of the copies."""
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    copies = collections.OrderedDict()
    for t in json.loads(out)["tests"]:
        prefix, _, _ = t["name"].partition(".")
        cmd = t.get("command") or []
        if prefix not in COPIES or not cmd or not cmd[0].endswith("/" + binary_name):
            continue
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []))
        skip = props.get("SKIP_REGULAR_EXPRESSION", [None])[0]
        filt = [a for a in cmd[1:] if a.startswith("--gtest_filter=")]
        if len(filt) != 1 or skip is None:
            sys.exit(f"{t['name']}: expected one --gtest_filter and a SKIP_REGULAR_EXPRESSION, "
                     f"got {cmd} {props}")
        entry = copies.setdefault(prefix, (cmd[0], env, skip, []))
        if entry[1] != env:
            sys.exit(f"{t['name']}: environment {env} differs from its copy's {entry[1]}")
        entry[3].append(filt[0][len("--gtest_filter="):])
    return copies


def run(argv, env):
    full_env = dict(os.environ)
    for k in ("PSTRAIN_ISA", "PSTRAIN_TEST_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        full_env.pop(k, None)
    full_env.update(env)
    full_env["OMP_WAIT_POLICY"] = "PASSIVE"
    p = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    build_dir, binary_name = sys.argv[1], sys.argv[2]
    qemu = sys.argv[3] if len(sys.argv) == 4 else "qemu-x86_64"
    copies = registered(build_dir, binary_name)
    missing = [c for c in COPIES if c not in copies]
    if missing:
        sys.exit(f"{binary_name}: no registered copies {missing} (is it one of the every-path "
                 "tests of tests/CMakeLists.txt?)")
    problems = []
    for prefix, (binary, env, skip, names) in copies.items():
        if list(env) != ["PSTRAIN_TEST_ISA"]:
            problems.append(f"{prefix}: its environment is {env}, expected PSTRAIN_TEST_ISA only")
            continue
        isa = env["PSTRAIN_TEST_ISA"]
        argv = [qemu, "-cpu", "Haswell", binary, "--gtest_filter=" + ":".join(names)]
        code, out = run(argv, env)
        m = re.search(r"^\[  SKIPPED \] (\d+) tests?, listed below", out, re.M)
        skipped = int(m.group(1)) if m else 0
        reason = (f"PSTRAIN_TEST_ISA={isa} is this CPU's best path" if isa == "avx2"
                  else f"PSTRAIN_TEST_ISA={isa}: this CPU (")
        if code != 0 or skipped != len(names) or not re.search(skip, out) or reason not in out:
            problems.append(f"{prefix} on an emulated Haswell: exit {code}, {skipped} of "
                            f"{len(names)} tests skipped, expected exit 0, all skipped and the "
                            f"reason '{reason}...'\n{out[-3000:]}")
        else:
            print(f"ok  {prefix}: {len(names)} tests skipped on an emulated Haswell: "
                  + re.search(r"PSTRAIN_TEST_ISA=.*", out).group(0))
    binary, env, skip, names = copies["isa_avx2"]
    code, out = run([binary, "--gtest_filter=" + ":".join(names)], env)
    if "PSTRAIN_TEST_ISA=avx2 is this CPU's best path" in out:
        ok = code == 0 and re.search(skip, out)
        what = "skipped (avx2 is this CPU's best path)"
    else:
        passed = re.search(r"^\[  PASSED  \] (\d+) test", out, re.M)
        # Tests of what the avx2 path cannot do (bf16) skip with their own reason; the rest run.
        ok = (code == 0 and "test process: isa avx2 (PSTRAIN_ISA=avx2" in out and passed
              and int(passed.group(1)) > 0 and "PSTRAIN_TEST_ISA=" not in out)
        what = f"ran its {len(names)} tests on the avx2 path"
    if ok:
        print(f"ok  isa_avx2 natively: {what}")
    else:
        problems.append(f"isa_avx2 natively: exit {code}, expected {what}\n{out[-3000:]}")
    if problems:
        print("\n\n".join(problems))
        sys.exit(1)


if __name__ == "__main__":
    main()
