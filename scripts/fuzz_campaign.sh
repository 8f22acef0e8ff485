#!/usr/bin/env bash
# One long libFuzzer campaign of one target, toward the 10M executions of issue 26's target:
# libFuzzer's fork mode, JOBS worker processes sharing one corpus (a copy of the seed corpus), for
# SECONDS, with the flags of scripts/fuzz.sh (AddressSanitizer and leak checks, 10 s per-input
# timeout, 2 GiB RSS limit, inputs up to 1 MB). The input of a crash, leak, timeout or
# out-of-memory is kept in build/fuzz/campaign/<target>/findings/; a crash ends the campaign, a
# timeout or an out-of-memory is counted and the campaign goes on (fork mode's defaults), and any
# of them fails this script. Prints one line to record in docs/FUZZING.md: executions, rate,
# oom/timeout/crash counts, coverage, exit status.
# JOBS: one per core for targets that keep a core busy; more than the cores for those that wait on
# loopback gRPC or threads (shard_requests, serve_requests, ps_client_answers, metrics: about half
# idle in one process).
# RUNS > 0: the campaign is stopped (SIGTERM to its process group) once fork mode's progress line
# counts RUNS executions or more (fork mode ignores -runs and a SIGINT to its parent only), and
# that stop is a success; otherwise it runs for SECONDS.
# A campaign in legs (for the slow targets, hours on 2 vCPUs): PSTRAIN_FUZZ_CAMPAIGN_DIR=DIR keeps
# the campaign in DIR/<target>/ (default build/fuzz/campaign/<target>/, which a fresh clone lacks)
# and PSTRAIN_FUZZ_RESUME=1 goes on from the corpus an earlier leg left there (the seeds are
# copied in again where missing), as ClusterFuzz's sessions go on from a kept corpus. Each leg
# appends a line to DIR/<target>/legs (UTC start, commit, executions, seconds, faults, exit), and
# RUNS then counts the executions of every leg so far. A leg that fails is in the ledger too.
# usage: scripts/fuzz_campaign.sh TARGET [JOBS, default nproc] [SECONDS, default 2700] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/fuzz_flags.sh
if [ $# -lt 1 ]; then
  echo "usage: scripts/fuzz_campaign.sh TARGET [JOBS] [SECONDS]" >&2
  exit 2
fi
target="$1"
jobs="${2:-$(nproc)}"
seconds="${3:-2700}"
runs_wanted="${4:-0}"
if [ ! -d "fuzz/corpus/$target" ]; then
  echo "fuzz_campaign.sh: no target '$target' (no fuzz/corpus/$target/)" >&2
  exit 2
fi
if ! command -v clang++ > /dev/null; then
  echo "fuzz_campaign.sh: clang++ is not installed (scripts/install_deps.sh installs it)" >&2
  exit 2
fi
cmake --preset fuzz > /dev/null
cmake --build build/fuzz --target "${target}_fuzzer" -j "$(nproc)"
fuzzer="$PWD/build/fuzz/fuzz/${target}_fuzzer"
dir="${PSTRAIN_FUZZ_CAMPAIGN_DIR:-build/fuzz/campaign}/$target"
earlier=0
if [ "${PSTRAIN_FUZZ_RESUME:-0}" = 1 ] && [ -d "$dir/corpus" ]; then
  if [ -n "$(find "$dir/findings" -type f 2> /dev/null)" ]; then
    echo "fuzz_campaign.sh: $dir/findings/ holds an earlier leg's findings; fix them first" >&2
    exit 1
  fi
  earlier=$(awk '{ n += $4 } END { print n + 0 }' "$dir/legs" 2> /dev/null || echo 0)
  if [ "$runs_wanted" -gt 0 ] && [ "$earlier" -ge "$runs_wanted" ]; then
    echo "fuzz campaign $target: $earlier executions in earlier legs, RUNS $runs_wanted reached"
    exit 0
  fi
  cp -n fuzz/corpus/"$target"/* "$dir/corpus/"
else
  rm -rf "$dir" && mkdir -p "$dir/corpus"
  cp fuzz/corpus/"$target"/* "$dir/corpus/"
fi
mkdir -p "$dir/findings"
log="$dir/log"
start=$(date +%s)
started=$(date -u '+%FT%TZ')
echo "fuzz campaign $target: $jobs jobs, ${seconds} s, from $(date -u '+%F %T') UTC (log: $log)" \
     "$([ "$earlier" -gt 0 ] && echo "after $earlier executions in earlier legs")"
set +e
# Its own process group (setsid), so that a stop reaches the fork-mode workers too.
(cd "$dir" && ASAN_OPTIONS=detect_leaks=1 exec setsid "$fuzzer" corpus \
   -fork="$jobs" -max_total_time="$seconds" "${FUZZ_FLAGS[@]}" \
   -artifact_prefix=findings/ -print_final_stats=1) > "$log" 2>&1 &
pid=$!
stopped=0
if [ "$runs_wanted" -gt 0 ]; then
  while kill -0 "$pid" 2> /dev/null; do
    n=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1 | sed -E 's/^#([0-9]+):.*/\1/')
    if [ $(( ${n:-0} + earlier )) -ge "$runs_wanted" ]; then
      stopped=1
      kill -TERM -- "-$pid" 2> /dev/null
      break
    fi
    sleep 5
  done
fi
wait "$pid"
rc=$?
# libFuzzer's exit status when interrupted (-interrupted_exitcode) is 72.
if [ "$stopped" = 1 ] && [ "$rc" -eq 72 ]; then rc=0; fi
set -e
elapsed=$(( $(date +%s) - start ))
# Fork mode's progress lines: "#<executions>: cov: <edges> ... oom/timeout/crash: a/b/c ...".
last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1 || true)
runs=$(sed -E 's/^#([0-9]+):.*/\1/' <<< "$last")
cov=$(grep -oE 'cov: [0-9]+' <<< "$last" | grep -oE '[0-9]+' || true)
faults=$(grep -oE 'oom/timeout/crash: [0-9]+/[0-9]+/[0-9]+' <<< "$last" | cut -d' ' -f2 || true)
found=$(find "$dir/findings" -type f | wc -l)
rate=$(( ${runs:-0} / (elapsed > 0 ? elapsed : 1) ))
echo "$started $(git rev-parse --short HEAD 2> /dev/null || echo '?') ${jobs}-jobs ${runs:-0}" \
     "$elapsed ${faults:-?} $found-findings exit-$rc" >> "$dir/legs"
echo "fuzz campaign $target: ${runs:-?} executions in $elapsed s ($rate a second), $jobs jobs," \
     "oom/timeout/crash ${faults:-?}, coverage ${cov:-?} edges, $found findings, exit $rc" \
     "$([ "$stopped" = 1 ] && echo "(stopped past $runs_wanted executions)")"
if [ "$earlier" -gt 0 ]; then
  echo "fuzz campaign $target: $(( earlier + ${runs:-0} )) executions in all legs ($dir/legs)"
fi
if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ] || [ "${faults:-?}" != 0/0/0 ]; then
  tail -40 "$log"
  exit 1
fi
