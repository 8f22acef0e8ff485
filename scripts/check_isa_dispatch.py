#!/usr/bin/env python3
"""Checks that a pstrain build is portable: AVX-512 and AMX code only behind runtime dispatch.

usage: check_isa_dispatch.py BINARY [--compile_commands build/compile_commands.json]
       check_isa_dispatch.py BINARY --expect_violation NAME   (the check's own test)

1. Disassembles BINARY (objdump) and lists every function that contains an EVEX-encoded
   instruction (the AVX-512 encoding: first opcode byte 0x62 in 64-bit mode) or an AMX
   instruction (ldtilecfg, tileloadd, tdpbf16ps, ...). Each such function must belong to a
   dispatched variant: its demangled name contains "avx512" or "amx" (the namespaces
   fm_avx512, fm_avx512_bf16, the *Avx512* functions), which the code reaches only after
   KernelIsa() (common/cpu.h) said the CPU has it.
2. With --compile_commands: no translation unit is compiled with -march=native, -mavx512* or
   -mamx*; pstrain's own sources are compiled for x86-64-v3, common/baseline_check.cc for plain
   x86-64, and the generated protobuf code with the compiler's default (plain x86-64).

Exits 1 with the offending functions or files listed, 0 with a summary otherwise. With
--expect_violation NAME it exits 0 only when a function whose name contains NAME is reported.
"""
import argparse
import json
import re
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
INSN = re.compile(r"^\s*[0-9a-f]+:\s+((?:[0-9a-f]{2} )+)\s*(\S+)?")
AMX = re.compile(r"^(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilerelease|tilezero|tdp)")
DISPATCHED = re.compile(r"avx512|amx", re.IGNORECASE)
# Legacy prefixes that may precede an EVEX instruction (address size, segments).
PREFIXES = {"67", "2e", "36", "3e", "26", "64", "65"}


def wide_functions(binary):
    """{function: [first offending instruction]} for functions with EVEX or AMX code."""
    out = subprocess.run(["objdump", "-d", "-C", "-w", binary], check=True,
                         capture_output=True, text=True).stdout
    found = {}
    fn = None
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(1)
            continue
        m = INSN.match(line)
        if not m or fn is None:
            continue
        raw = m.group(1).split()
        i = 0
        while i < len(raw) and raw[i] in PREFIXES:
            i += 1
        mnemonic = m.group(2) or ""
        if (i < len(raw) and raw[i] == "62") or AMX.match(mnemonic):
            found.setdefault(fn, line.strip())
    return found


def check_flags(path):
    bad = []
    with open(path) as f:
        commands = json.load(f)
    for c in commands:
        cmd = c.get("command") or " ".join(c.get("arguments", []))
        src = c["file"]
        wide = re.findall(r"-march=native|-mavx512\S*|-mamx\S*", cmd)
        if wide:
            bad.append(f"{src}: compiled with {' '.join(wide)}")
        elif src.endswith(".pb.cc"):
            if "-march=" in cmd:
                bad.append(f"{src}: generated code with an -march flag")
        elif src.endswith("common/baseline_check.cc"):
            if "-march=x86-64 " not in cmd + " ":
                bad.append(f"{src}: must be compiled for plain x86-64")
        elif "-march=x86-64-v3" not in cmd:
            bad.append(f"{src}: not compiled for the x86-64-v3 baseline")
    return bad, len(commands)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--compile_commands")
    ap.add_argument("--expect_violation")
    args = ap.parse_args()
    problems = []
    wide = wide_functions(args.binary)
    undispatched = {f: i for f, i in wide.items() if not DISPATCHED.search(f)}
    if args.expect_violation:
        hits = [f for f in undispatched if args.expect_violation in f]
        print(f"expected a violation in {args.expect_violation}: "
              f"{'reported: ' + ', '.join(hits) if hits else 'NOT reported'}")
        return 0 if hits else 1
    for f, insn in sorted(undispatched.items()):
        problems.append(f"AVX-512/AMX code outside a dispatched variant: {f}\n    {insn}")
    units = 0
    if args.compile_commands:
        bad, units = check_flags(args.compile_commands)
        problems += bad
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{args.binary}: {len(wide)} functions use AVX-512/AMX, all in dispatched variants:")
    for f in sorted(wide):
        print(f"  {f}")
    if args.compile_commands:
        print(f"{units} translation units: none for -march=native or AVX-512/AMX; pstrain's own "
              "for the x86-64-v3 baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
