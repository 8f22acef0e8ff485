#!/usr/bin/env bash
# Emulated hosts on one machine: N "hosts", each a network namespace joined by a veth link to a
# bridge, each link capped with tc, each host's memory capped; and pstrain jobs run across them.
#
#   scripts/emulate_hosts.sh [options] run ps|allreduce -- PSTRAIN_TRAINING_FLAGS...
#       Builds the hosts, runs the job, prints where its logs are, removes everything; exits
#       with the job's status (124 when --timeout_s ran out).
#       ps:        one `pstrain host --cluster ... --index i --bind 0.0.0.0` in each host (a shard
#                  and a worker), with a fresh cluster secret in the environment.
#       allreduce: `mpirun -np N pstrain allreduce` with one rank per host: mpirun runs in a
#                  launcher namespace on the bridge (uncapped) and starts one orted per host
#                  through this script's `_agent` (OpenMPI's plm_rsh_agent: `nsenter --net`
#                  instead of ssh); the ranks talk TCP over the hosts' capped links
#                  (btl tcp,self; btl_tcp_if_include / oob_tcp_if_include the hosts' subnet).
#   scripts/emulate_hosts.sh [options] up        builds the hosts and leaves them (for tests)
#   scripts/emulate_hosts.sh [options] down      removes them (and ends what runs in them)
#   scripts/emulate_hosts.sh [options] link I up|down
#                                                 sets host I's link on the bridge side (a cut)
#   scripts/emulate_hosts.sh [options] names      prints "I NAMESPACE ADDRESS" per host
#
# Options (before the subcommand):
#   --hosts N         hosts (default 2, at most 200)
#   --mbit M          bandwidth of each host's link, each direction, Mbit/s (tbf); 0 = uncapped
#   --latency_ms L    one-way host-to-host latency (sch_netem, L/2 on each side of the bridge);
#                     0 = none. Refused with the reason where the kernel has no sch_netem.
#   --memory_mb M     memory of each host: a memory cgroup (v2 memory.max or v1
#                     memory.limit_in_bytes) under this shell's own; 0 = uncapped. Without a
#                     writable memory cgroup: prlimit --as on each process, said when used.
#   --tag T           names: namespaces pst<T>h<i> and pst<T>r (bridge), pst<T>l (launcher);
#                     default: this script's pid. At most 8 characters [a-z0-9].
#   --subnet A.B.C    the hosts' /24 (default 10.77.0): host i is A.B.C.(i+1)
#   --port P          the PS port in every host (default 2223)
#   --binary PATH     pstrain (default: build/release/pstrain of this checkout)
#   --work DIR        logs and the per-host memory report go here (default: a fresh /tmp dir)
#   --timeout_s S     bound on the whole job (default 1800); then everything is killed
#   --launch_timeout_s S  allreduce: a launch with no rank past MPI_Init after S s (default 30)
#                     is ended and started again, up to --launch_attempts times (default 4);
#                     exit status 3 when every attempt hangs
#
# Memory: a cgroup caps what a host really uses (the resident memory and page cache of all its
# processes together, as a container's limit does), and the kernel's OOM killer acts as on a
# real host. prlimit --as caps each process's virtual address space instead, which counts thread
# stacks and reserved malloc arenas never touched: a poor proxy, used only without a cgroup.
# At the end of `run`, <work>/hosts.json holds each host's peak memory (cgroup max usage), the CPU
# seconds its processes used (v2 cpu.stat, or a v1 cpuacct cgroup per host) and the bytes its
# link carried each way (eth0's counters).
#
# Everything it starts is ended and removed on exit, Ctrl-C, SIGTERM or failure (trap): the
# processes in the namespaces, the namespaces (their veths and bridge with them), the cgroups.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2 (scripts/install_deps.sh).
set -euo pipefail

SOURCE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$SOURCE_ROOT/scripts/emulate_hosts.sh"
HOSTS=2 MBIT=0 LATENCY_MS=0 MEMORY_MB=0 TAG="$$" SUBNET=10.77.0 PORT=2223
BINARY="$SOURCE_ROOT/build/release/pstrain" WORK="" TIMEOUT_S=1800 LAUNCH_TIMEOUT_S=30 LAUNCH_ATTEMPTS=4

die() { echo "emulate_hosts: $*" >&2; exit 2; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_number() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; }

while [[ $# -gt 0 && "$1" == --* ]]; do
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case "$1" in
    --hosts) HOSTS="$2" ;;
    --mbit) MBIT="$2" ;;
    --latency_ms) LATENCY_MS="$2" ;;
    --memory_mb) MEMORY_MB="$2" ;;
    --tag) TAG="$2" ;;
    --subnet) SUBNET="$2" ;;
    --port) PORT="$2" ;;
    --binary) BINARY="$2" ;;
    --work) WORK="$2" ;;
    --timeout_s) TIMEOUT_S="$2" ;;
    --launch_timeout_s) LAUNCH_TIMEOUT_S="$2" ;;
    --launch_attempts) LAUNCH_ATTEMPTS="$2" ;;
    *) die "unknown option $1 (see the header of $SELF)" ;;
  esac
  shift 2
done
is_uint "$HOSTS" && ((HOSTS >= 1 && HOSTS <= 200)) || die "--hosts: expected 1..200, got '$HOSTS'"
is_number "$MBIT" || die "--mbit: expected a number of Mbit/s (0 = uncapped), got '$MBIT'"
is_number "$LATENCY_MS" || die "--latency_ms: expected a number of ms, got '$LATENCY_MS'"
is_uint "$MEMORY_MB" || die "--memory_mb: expected whole MB (0 = uncapped), got '$MEMORY_MB'"
[[ "$TAG" =~ ^[a-z0-9]{1,8}$ ]] || die "--tag: expected 1-8 characters [a-z0-9], got '$TAG'"
[[ "$SUBNET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "--subnet: expected A.B.C, got '$SUBNET'"
is_uint "$PORT" && ((PORT > 0 && PORT < 65536)) || die "--port: expected 1..65535, got '$PORT'"
is_uint "$TIMEOUT_S" && ((TIMEOUT_S > 0)) || die "--timeout_s: expected seconds > 0, got '$TIMEOUT_S'"
is_uint "$LAUNCH_TIMEOUT_S" && ((LAUNCH_TIMEOUT_S > 0)) || die "--launch_timeout_s: expected seconds > 0, got '$LAUNCH_TIMEOUT_S'"
is_uint "$LAUNCH_ATTEMPTS" && ((LAUNCH_ATTEMPTS > 0)) || die "--launch_attempts: expected a count > 0, got '$LAUNCH_ATTEMPTS'"
[[ $# -ge 1 ]] || die "expected a subcommand: run, up, down, link or names (see the header of $SELF)"
CMD="$1"
shift

# nsenter, not `ip netns exec`: the latter remounts /sys in a new mount namespace, which hides
# the cgroup files from what runs there (mpirun's agent joins the hosts' cgroups).
NETNS_DIR=/run/netns
BRIDGE_NS="pst${TAG}r" LAUNCHER_NS="pst${TAG}l" LAUNCHER_ADDR="$SUBNET.254"
ns() { echo "pst${TAG}h$1"; }
addr() { echo "$SUBNET.$(($1 + 1))"; }
peer() { echo "v${TAG}h$1"; }  # host i's veth end in the bridge namespace (<= 15 characters)

# --- memory caps --------------------------------------------------------------------------------
# This shell's cgroup directory of a cgroup v1 controller (its mount plus its path), or "".
v1_cgroup_dir() {
  local mnt rel
  # mountinfo: ... MOUNT_POINT ... [optional fields] - FSTYPE SOURCE SUPER_OPTIONS
  mnt="$(awk -v c="$1" '{ for (i = 7; i < NF; i++) if ($i == "-") break
    if ($(i + 1) == "cgroup" && $NF ~ "(^|,)" c "(,|$)") { print $5; exit } }' /proc/self/mountinfo)"
  rel="$(awk -F: -v c="$1" '$2 ~ "(^|,)" c "(,|$)" {print $3}' /proc/self/cgroup)"
  if [[ -n "$mnt" && -d "$mnt${rel%/}" ]]; then echo "$mnt${rel%/}"; fi
}

# The directory of this shell's memory cgroup and the file of its limit, or nothing.
MEMCG_BASE="" MEMCG_LIMIT_FILE="" MEMCG_PEAK_FILE=""
find_memcg() {
  local rel
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    rel="$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)"
    MEMCG_BASE="/sys/fs/cgroup${rel%/}" MEMCG_LIMIT_FILE=memory.max MEMCG_PEAK_FILE=memory.peak
    # Children get the memory controller only when the parent hands it down.
    grep -qw memory "$MEMCG_BASE/cgroup.subtree_control" 2>/dev/null ||
      echo +memory > "$MEMCG_BASE/cgroup.subtree_control" 2>/dev/null || MEMCG_BASE=""
  else
    MEMCG_BASE="$(v1_cgroup_dir memory)"
    [[ -z "$MEMCG_BASE" ]] || MEMCG_LIMIT_FILE=memory.limit_in_bytes MEMCG_PEAK_FILE=memory.max_usage_in_bytes
  fi
}
memcg() { echo "$MEMCG_BASE/pstrain-emul-${TAG}-h$1"; }

# CPU time per host: v2's cpu.stat in the memory cgroup, or a v1 cpuacct cgroup beside it.
CPUCG_BASE="" CPU_MODE="none"
cpucg() { echo "$CPUCG_BASE/pstrain-emul-${TAG}-h$1"; }
find_cpucg() { CPUCG_BASE="$(v1_cgroup_dir cpuacct)"; }
# Seconds of CPU that host i's processes used, or null.
cpu_seconds() {
  case "$CPU_MODE" in
    v2) awk '$1 == "usage_usec" { printf "%.3f", $2 / 1e6 }' "$(memcg "$1")/cpu.stat" 2> /dev/null || echo null ;;
    cpuacct) awk '{ printf "%.3f", $1 / 1e9 }' "$(cpucg "$1")/cpuacct.usage" 2> /dev/null || echo null ;;
    *) echo null ;;
  esac
}

# How each host's memory is capped and measured: cgroup, prlimit or none.
MEM_MODE="none"
setup_cgroups() {
  find_memcg
  # A cgroup per host also when uncapped: its peak is each host's memory in hosts.json.
  local limit=max
  [[ "$MEMCG_LIMIT_FILE" == memory.max ]] || limit=-1
  ((MEMORY_MB == 0)) || limit=$((MEMORY_MB * 1024 * 1024))
  if [[ -n "$MEMCG_BASE" ]] && mkdir -p "$(memcg 0)" 2> /dev/null &&
      echo "$limit" > "$(memcg 0)/$MEMCG_LIMIT_FILE" 2> /dev/null; then
    MEM_MODE="cgroup"
    for ((i = 1; i < HOSTS; i++)); do
      mkdir -p "$(memcg "$i")"
      echo "$limit" > "$(memcg "$i")/$MEMCG_LIMIT_FILE"
    done
    echo "emulate_hosts: memory: a cgroup per host ($MEMCG_BASE/pstrain-emul-${TAG}-h*)," \
         "$MEMCG_LIMIT_FILE = $limit"
    if [[ "$MEMCG_LIMIT_FILE" == memory.max ]]; then
      CPU_MODE=v2
    else
      find_cpucg
      if [[ -n "$CPUCG_BASE" ]] && mkdir -p "$(cpucg 0)" 2> /dev/null; then
        CPU_MODE=cpuacct
        for ((i = 1; i < HOSTS; i++)); do mkdir -p "$(cpucg "$i")"; done
      fi
    fi
  elif ((MEMORY_MB > 0)); then
    command -v prlimit > /dev/null || die "--memory_mb: no writable memory cgroup and no prlimit (util-linux)"
    MEM_MODE="prlimit"
    echo "emulate_hosts: memory: no writable memory cgroup here; prlimit --as=$MEMORY_MB MB per" \
         "process instead (virtual address space: counts untouched reservations, so stricter)"
  fi
}

# Runs "$@" in host i: its memory cap, then its namespace. Replaces the shell (exec).
exec_in_host() {
  local i="$1"
  shift
  case "$MEM_MODE" in
    cgroup)
      echo $BASHPID > "$(memcg "$i")/cgroup.procs"
      [[ "$CPU_MODE" != cpuacct ]] || echo $BASHPID > "$(cpucg "$i")/cgroup.procs"
      ;;
    prlimit) set -- prlimit --as=$((MEMORY_MB * 1024 * 1024)) "$@" ;;
  esac
  exec nsenter --net="$NETNS_DIR/$(ns "$i")" "$@"
}

# --- the network --------------------------------------------------------------------------------
# tc on one interface (in namespace $1, device $2): tbf at MBIT, netem delay $3 ms in front.
shape() {
  local n="$1" dev="$2" delay_ms="$3" parent="root"
  if [[ "$delay_ms" != 0 ]]; then
    ip netns exec "$n" tc qdisc add dev "$dev" root handle 1: netem delay "${delay_ms}ms"
    parent="parent 1:"
  fi
  if [[ "$MBIT" != 0 ]]; then
    # The bucket holds at least 2 ms of traffic and one 64 KB GSO segment.
    local burst
    burst="$(awk -v m="$MBIT" 'BEGIN { b = m * 1e6 / 8 * 0.002; if (b < 131072) b = 131072; printf "%d", b }')"
    # shellcheck disable=SC2086
    ip netns exec "$n" tc qdisc add dev "$dev" $parent handle 2: tbf rate "${MBIT}mbit" \
        burst "$burst" latency 10ms
  fi
}

up() {
  command -v ip > /dev/null || die "iproute2's ip is not installed (scripts/install_deps.sh installs it)"
  if [[ "$LATENCY_MS" != 0 ]]; then
    command -v tc > /dev/null || die "--latency_ms needs tc (iproute2)"
  fi
  [[ "$MBIT" == 0 ]] || command -v tc > /dev/null || die "--mbit needs tc (iproute2)"
  ip netns add "$BRIDGE_NS" || die "cannot create a network namespace here (needs root / CAP_SYS_ADMIN)"
  ip -n "$BRIDGE_NS" link add name br0 type bridge
  ip -n "$BRIDGE_NS" link set dev br0 up
  ip -n "$BRIDGE_NS" link set dev lo up
  local half_delay=0
  if [[ "$LATENCY_MS" != 0 ]]; then
    half_delay="$(awk -v l="$LATENCY_MS" 'BEGIN { printf "%g", l / 2 }')"
  fi
  for ((i = 0; i < HOSTS; i++)); do
    local n p
    n="$(ns "$i")" p="$(peer "$i")"
    ip netns add "$n"
    ip -n "$n" link set dev lo up
    ip -n "$n" link add name eth0 type veth peer name "$p" netns "$BRIDGE_NS"
    ip -n "$n" addr add "$(addr "$i")/24" dev eth0
    ip -n "$n" link set dev eth0 up
    ip -n "$BRIDGE_NS" link set dev "$p" master br0
    ip -n "$BRIDGE_NS" link set dev "$p" up
    if [[ "$LATENCY_MS" != 0 ]] && ! ip netns exec "$n" tc qdisc add dev lo root netem delay 0ms 2> /dev/null; then
      die "--latency_ms: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM), so latency cannot" \
          "be emulated here; use --latency_ms 0 (bandwidth caps use tbf)"
    fi
    [[ "$LATENCY_MS" == 0 ]] || ip netns exec "$n" tc qdisc del dev lo root
    shape "$n" eth0 "$half_delay"            # what host i sends
    shape "$BRIDGE_NS" "$p" "$half_delay"    # what host i receives
  done
  # The launcher (mpirun) sits on the bridge without a cap: its control traffic is not the job's.
  ip netns add "$LAUNCHER_NS"
  ip -n "$LAUNCHER_NS" link set dev lo up
  ip -n "$LAUNCHER_NS" link add name eth0 type veth peer name "v${TAG}l" netns "$BRIDGE_NS"
  ip -n "$LAUNCHER_NS" addr add "$LAUNCHER_ADDR/24" dev eth0
  ip -n "$LAUNCHER_NS" link set dev eth0 up
  ip -n "$BRIDGE_NS" link set dev "v${TAG}l" master br0
  ip -n "$BRIDGE_NS" link set dev "v${TAG}l" up
}

# Ends every process in our namespaces and removes them, then the cgroups. Safe to run twice.
down() {
  local n
  for n in "$LAUNCHER_NS" $(for ((i = 0; i < HOSTS; i++)); do ns "$i"; done) "$BRIDGE_NS"; do
    [[ -e "$NETNS_DIR/$n" ]] || continue
    local pids
    pids="$(ip netns pids "$n" 2> /dev/null || true)"
    # shellcheck disable=SC2086
    [[ -z "$pids" ]] || kill -KILL $pids 2> /dev/null || true
    ip netns del "$n" 2> /dev/null || true
  done
  [[ -n "$MEMCG_BASE" ]] || find_memcg
  [[ -n "$CPUCG_BASE" ]] || find_cpucg
  if [[ -n "$MEMCG_BASE" ]]; then
    for ((i = 0; i < HOSTS; i++)); do
      local cg
      [[ -z "$CPUCG_BASE" || ! -d "$(cpucg "$i")" ]] || rmdir "$(cpucg "$i")" 2> /dev/null || true
      cg="$(memcg "$i")"
      [[ -d "$cg" ]] || continue
      local pids
      pids="$(cat "$cg/cgroup.procs" 2> /dev/null || true)"
      # shellcheck disable=SC2086
      [[ -z "$pids" ]] || kill -KILL $pids 2> /dev/null || true
      # A killed process leaves its cgroup when it has been reaped: a bounded retry.
      for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$cg" 2> /dev/null && break; sleep 0.2; done
    done
  fi
}

# Each host's peak memory (MB) as JSON, from the cgroups.
write_hosts_json() {
  local out="$1" sep="" i
  {
    printf '{"memory_cap": "%s", "memory_mb": %s, "mbit": %s, "latency_ms": %s, "hosts": [' \
        "$MEM_MODE" "$MEMORY_MB" "$MBIT" "$LATENCY_MS"
    for ((i = 0; i < HOSTS; i++)); do
      local peak=null
      if [[ "$MEM_MODE" == cgroup && -r "$(memcg "$i")/$MEMCG_PEAK_FILE" ]]; then
        peak="$(awk '{ printf "%.1f", $1 / 1048576 }' "$(memcg "$i")/$MEMCG_PEAK_FILE")"
      fi
      # What crossed the host's link (its eth0's counters), each way.
      local tx rx
      tx="$(ip netns exec "$(ns "$i")" cat /sys/class/net/eth0/statistics/tx_bytes 2> /dev/null || echo null)"
      rx="$(ip netns exec "$(ns "$i")" cat /sys/class/net/eth0/statistics/rx_bytes 2> /dev/null || echo null)"
      printf '%s{"host": %d, "namespace": "%s", "address": "%s", "peak_memory_mb": %s, "cpu_seconds": %s, "tx_bytes": %s, "rx_bytes": %s}' \
          "$sep" "$i" "$(ns "$i")" "$(addr "$i")" "$peak" "$(cpu_seconds "$i")" "$tx" "$rx"
      sep=", "
    done
    printf ']}\n'
  } > "$out"
}

run_ps() {
  local cluster="" i secret status=0
  for ((i = 0; i < HOSTS; i++)); do cluster+="${cluster:+,}$(addr "$i"):$PORT"; done
  secret="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
  local pids=()
  for ((i = 0; i < HOSTS; i++)); do
    (exec_in_host "$i" env PSTRAIN_CLUSTER_SECRET="$secret" "$BINARY" host --cluster "$cluster" \
        --index "$i" --bind 0.0.0.0 "$@") > "$WORK/host$i.log" 2>&1 &
    pids+=($!)
  done
  echo "emulate_hosts: ps: $HOSTS hosts ($cluster), logs $WORK/host*.log"
  for i in "${!pids[@]}"; do
    local s=0
    wait "${pids[$i]}" || s=$?
    [[ $s == 0 ]] || { echo "emulate_hosts: host $i exited with $s (log: $WORK/host$i.log)" >&2; tail -n 5 "$WORK/host$i.log" >&2; }
    [[ $status != 0 ]] || status=$s
  done
  return "$status"
}

# Ends every process in the hosts' and the launcher's namespaces (a launch being retried).
kill_job_processes() {
  local n pids
  for n in "$LAUNCHER_NS" $(for ((i = 0; i < HOSTS; i++)); do ns "$i"; done); do
    pids="$(ip netns pids "$n" 2> /dev/null || true)"
    # shellcheck disable=SC2086
    [[ -z "$pids" ]] || kill -KILL $pids 2> /dev/null || true
  done
}

run_allreduce() {
  local hostfile="$WORK/hostfile" i attempt
  ranks_up() { grep -q "pstrain allreduce: [0-9]* ranks up" "$WORK/mpirun.log" 2> /dev/null; }
  : > "$hostfile"
  for ((i = 0; i < HOSTS; i++)); do echo "$(addr "$i") slots=1" >> "$hostfile"; done
  echo "emulate_hosts: allreduce: $HOSTS ranks, one per host; log $WORK/mpirun.log"
  local s=0
  # A launch can hang: one host's orted never comes up (it daemonizes, so its agent exits 0 and
  # mpirun waits for it; orte_startup_timeout does not fire). Seen in about 1 of 3 two-host
  # launches on 2026-11-24, cause not found; not seen in 40 launches on 2026-11-27 (20 one at a
  # time, 20 two at a time, beside two busy loops). Why it hangs rather than fails (OpenMPI 4.1.4
  # source): with plm_rsh_no_tree_spawn the orted gets --daemonize (plm_rsh_module.c), so the
  # agent's exit status, mpirun's only other news of a daemon, is 0 at once, and the daemon's own
  # errors go nowhere; and orte_startup_timeout's timer is armed in orte_plm_base_launch_apps
  # (plm_base_launch_support.c), which runs only once every daemon has reported. Rank 0 prints "pstrain allreduce: N ranks up" right
  # after MPI_Init, so a log without that line after LAUNCH_TIMEOUT_S is a hung launch: it is ended
  # and started again. (Not "a log still empty": the agents' and orteds' own messages land in
  # the same log before any rank runs, and one such line once made a hung launch look started.)
  for ((attempt = 1; attempt <= LAUNCH_ATTEMPTS; attempt++)); do
    s=0
    # The agent gets this script's settings from the environment.
    EMUL_TAG="$TAG" EMUL_HOSTS="$HOSTS" EMUL_SUBNET="$SUBNET" EMUL_MEM_MODE="$MEM_MODE" \
    EMUL_MEMORY_MB="$MEMORY_MB" EMUL_MEMCG_BASE="$MEMCG_BASE" EMUL_CPU_MODE="$CPU_MODE" \
    EMUL_CPUCG_BASE="$CPUCG_BASE" \
      nsenter --net="$NETNS_DIR/$LAUNCHER_NS" mpirun --allow-run-as-root --hostfile "$hostfile" -np "$HOSTS" \
        --mca plm_rsh_agent "$SELF _agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca orte_startup_timeout 120 \
        --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET.0/24" \
        --mca oob_tcp_if_include "$SUBNET.0/24" --bind-to none \
        "$BINARY" allreduce "$@" > "$WORK/mpirun.log" 2>&1 &
    local mp=$! waited=0
    while kill -0 "$mp" 2> /dev/null && ! ranks_up && ((waited < LAUNCH_TIMEOUT_S)); do
      sleep 1
      waited=$((waited + 1))
    done
    if kill -0 "$mp" 2> /dev/null && ! ranks_up; then
      echo "emulate_hosts: allreduce: no rank started within --launch_timeout_s $LAUNCH_TIMEOUT_S (attempt $attempt of $LAUNCH_ATTEMPTS); ending that launch" >&2
      kill -KILL "$mp" 2> /dev/null || true
      wait "$mp" 2> /dev/null || true
      kill_job_processes
      s=3  # not 124: that is the whole job's --timeout_s
      continue
    fi
    wait "$mp" || s=$?
    break
  done
  [[ $s == 0 ]] || { echo "emulate_hosts: mpirun exited with $s (log: $WORK/mpirun.log)" >&2; tail -n 8 "$WORK/mpirun.log" >&2; }
  return "$s"
}

# OpenMPI's rsh agent: `_agent [ssh options] HOST COMMAND...`: runs COMMAND (a shell line) in the
# namespace and memory cap of the host with address HOST. (A daemon that does not come up within
# orte_startup_timeout ends the job: seen once here with 8 ranks, one of the 8 orteds never
# reported and mpirun waited for it.)
agent() {
  while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
  local host="$1" i
  shift
  TAG="$EMUL_TAG" HOSTS="$EMUL_HOSTS" SUBNET="$EMUL_SUBNET" MEM_MODE="$EMUL_MEM_MODE"
  MEMORY_MB="$EMUL_MEMORY_MB" MEMCG_BASE="$EMUL_MEMCG_BASE" CPU_MODE="$EMUL_CPU_MODE"
  CPUCG_BASE="$EMUL_CPUCG_BASE"
  for ((i = 0; i < HOSTS; i++)); do
    [[ "$(addr "$i")" != "$host" ]] || exec_in_host "$i" /bin/sh -c "$*"
  done
  echo "emulate_hosts _agent: $host is not an emulated host" >&2
  exit 1
}

case "$CMD" in
  _agent) agent "$@" ;;
  names) for ((i = 0; i < HOSTS; i++)); do echo "$i $(ns "$i") $(addr "$i")"; done ;;
  up) down; (up) || { down; exit 2; } ;;
  down) down ;;
  link)
    [[ $# == 2 ]] && is_uint "$1" && (($1 < HOSTS)) && [[ "$2" == up || "$2" == down ]] ||
      die "link: expected HOST_INDEX up|down"
    ip -n "$BRIDGE_NS" link set dev "$(peer "$1")" "$2"
    ;;
  run)
    [[ $# -ge 1 && ( "$1" == ps || "$1" == allreduce ) ]] || die "run: expected ps or allreduce"
    MODE="$1"
    shift
    [[ $# == 0 || "$1" != -- ]] || shift
    [[ -x "$BINARY" ]] || die "no pstrain binary at $BINARY (build it: scripts/build.sh, or --binary)"
    [[ "$MODE" != allreduce ]] || command -v mpirun > /dev/null || die "allreduce needs mpirun (scripts/install_deps.sh)"
    WORK="${WORK:-$(mktemp -d /tmp/emulate_hosts.XXXXXX)}"
    mkdir -p "$WORK"
    JOB=""
    trap 'down' EXIT
    # A signal ends the job at once (wait returns for a trapped signal), then the EXIT trap.
    trap 'echo "emulate_hosts: interrupted; removing the hosts" >&2;
          [[ -z "$JOB" ]] || kill -TERM "$JOB" 2> /dev/null || true; exit 130' INT TERM
    down  # leftovers of an earlier run with this tag
    setup_cgroups
    up
    echo "emulate_hosts: $HOSTS hosts on $SUBNET.0/24, links ${MBIT} Mbit/s (0 = uncapped)," \
         "latency ${LATENCY_MS} ms, memory ${MEMORY_MB} MB per host (0 = uncapped; $MEM_MODE)"
    status=0
    # The bound: timeout(1) ends the job's launcher; down (the trap) ends all that is left.
    export -f exec_in_host ns addr memcg cpucg run_ps run_allreduce kill_job_processes
    export LAUNCH_TIMEOUT_S LAUNCH_ATTEMPTS TAG SUBNET HOSTS PORT BINARY WORK MEM_MODE MEMORY_MB MEMCG_BASE SELF LAUNCHER_NS NETNS_DIR \
        CPU_MODE CPUCG_BASE
    timeout -k 10 "$TIMEOUT_S" bash -c "run_$MODE \"\$@\"" run "$@" &
    JOB=$!
    wait "$JOB" || status=$?
    write_hosts_json "$WORK/hosts.json"
    [[ $status != 124 ]] || echo "emulate_hosts: the job ran out of --timeout_s $TIMEOUT_S" >&2
    echo "emulate_hosts: done (status $status); per-host memory: $WORK/hosts.json"
    exit "$status"
    ;;
  *) die "unknown subcommand '$CMD' (run, up, down, link, names)" ;;
esac
