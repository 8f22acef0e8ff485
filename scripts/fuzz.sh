#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (the `fuzz` preset: clang, AddressSanitizer) and runs each
# for a bounded time on a copy of its seed corpus. A crash, a leak, a timeout (an input taking
# more than 10 s: a hang or a spin) or an out-of-memory (an RSS above 2 GiB, or one allocation
# above it) fails the run; the input that caused it is left in build/fuzz/findings/<target>/ to
# turn into a test. Inputs are up to 1 MB (the seed corpora hold large inputs too). Prints each
# target's executions, coverage and peak RSS.
# usage: scripts/fuzz.sh [seconds per target, default 30] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/fuzz_flags.sh
seconds="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # As fuzz/CMakeLists.txt lists them.
  targets=(criteo_tsv csv libsvm tfrecord recordio checkpoint config shard_requests export_model
           serve_requests checkpoint_dir cluster_env ps_client_answers metrics)
fi
if ! command -v clang++ > /dev/null; then
  echo "fuzz.sh: clang++ is not installed (scripts/install_deps.sh installs it); skipping"
  exit 0
fi
cmake --preset fuzz > /dev/null
cmake --build build/fuzz --target fuzzers -j "$(nproc)"
failed=0
for t in "${targets[@]}"; do
  work="build/fuzz/work/$t"
  findings="build/fuzz/findings/$t"
  rm -rf "$work" && mkdir -p "$work" "$findings"
  cp fuzz/corpus/"$t"/* "$work"/
  log="build/fuzz/$t.log"
  # -fork=0: one process; ASan's leak check at exit; inputs up to 1 MB.
  if ASAN_OPTIONS=detect_leaks=1 build/fuzz/fuzz/"$t"_fuzzer "$work" \
      -max_total_time="$seconds" "${FUZZ_FLAGS[@]}" \
      -artifact_prefix="$findings/" -print_final_stats=1 > "$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
  rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "fuzz $t: $status, $runs executions in ${seconds} s, coverage $cov edges, peak RSS" \
       "$rss MB (log: $log)"
  if [ "$status" = FAILED ]; then tail -40 "$log"; fi
done
exit $failed
