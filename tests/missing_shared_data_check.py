#!/usr/bin/env python3
"""Runs the tests that read ../shared/data with that folder missing, and checks that each one
fails cleanly: it runs, fails with "shared test data missing" and the path, and the process exits
with gtest's failure code (1), not a signal (an abort or a segfault) and not success.

usage: missing_shared_data_check.py BINARY:Suite.Test[:Suite.Test...] ...
"""
import os
import subprocess
import sys
import tempfile


def main():
    missing = os.path.join(tempfile.gettempdir(), "pstrain_no_shared_data_here")
    env = dict(os.environ, PSTRAIN_SHARED_DATA_DIR=missing)
    problems = []
    checked = 0
    for arg in sys.argv[1:]:
        binary, _, tests = arg.partition(":")
        names = tests.split(":")
        run = subprocess.run([binary, "--gtest_filter=" + tests], env=env, capture_output=True,
                             text=True, timeout=300)
        out = run.stdout + run.stderr
        if run.returncode != 1:
            problems.append(f"{binary} {tests}: exit code {run.returncode} (a negative code is a "
                            "signal), expected 1 (the tests fail)\n" + out[-2000:])
            continue
        for name in names:
            checked += 1
            if f"[  FAILED  ] {name} " not in out and not out.count(f"[  FAILED  ] {name}\n"):
                problems.append(f"{name}: did not fail with the data missing")
        if out.count("shared test data missing: " + missing) < len(names):
            problems.append(f"{binary}: expected each test to name the missing path\n" + out[-2000:])
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{checked} tests fail cleanly, naming {missing}/..., when the shared data is missing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
