#!/usr/bin/env bash
# gpu_check.sh: one pass over a lent GPU machine, as root, that records what Arranger's pod
# confinement does on a real NVIDIA GPU and how NVIDIA MPS behaves across owners. Run once,
# from the repository root, with Arranger importable (PYTHONPATH) and `arranger` on PATH:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH && timeout -k 20 420 bash bench/gpu_check.sh
#
# Sections: 1 facts (GPU, driver, device nodes, cgroups, bpf); 2 a TLS server, tokens for two
# owners and an admin, and one root agent with runAs: owner on 127.0.0.1 that finds the GPU
# through NVML (and, where MPS is installed, holds GPU shares with it: gpuSharing: mps); 3
# one-pod jobs run as their owners' throw-away accounts: one GPU, no GPU (its environment
# cleared), a pids limit of 64, and where shares are held three 0.5 pods: one of each owner at
# once (0.4 then 0.6 of the GPU's memory: the first fits, the second must fail; a greedy
# allocator; matmuls measured together; JAX preallocating as it does by default) and one that
# first raises its own CUDA_MPS_* limits (it must be held the same), with `top` and the agent's
# per-pod metrics while they run; 5 two plain processes time-sliced without MPS (the cost of
# sharing unheld); 4 MPS by hand: two users at once, two 50 % clients, active thread
# percentages, a pinned device memory limit. Each section prints what it ran and got and goes
# on whatever failed; the whole report goes to stdout and to $OUT/gpu_check.txt (OUT default
# /tmp/out), the daemons' logs to $OUT/gpu_check_logs/.
#
# It changes no GPU setting (no nvidia-smi -c, MIG, clocks or reset). Everything it starts it
# stops (the MPS daemon with `quit`, the server and agent, the probes), and the accounts it
# makes it removes, on every exit (trap). The probes are in bench/gpu_check.py (copied to a
# temporary directory every account may read). Work stops starting new steps once
# GPU_CHECK_BUDGET_S (default 330) seconds have passed; each step has its own timeout.

set -o pipefail
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-330}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
REPORT="$OUT/gpu_check.txt"
: >"$REPORT"
# tee ignores the signals a timeout sends to the whole process group, so that the cleanup's
# lines still reach the report (and the script is not killed by SIGPIPE while it cleans up).
exec > >(trap '' INT TERM HUP; exec tee -a "$REPORT") 2>&1
TEE_PID=$!

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=$(command -v python3 || true)
# POD_PY: the interpreter of the pods' and MPS clients' probes (the one with torch); they need
# only it and the standard library. GPU_CHECK_PYTHON overrides it.
POD_PY=${GPU_CHECK_PYTHON:-$PY}
TAG=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TOP=$(mktemp -d "/tmp/gpu-check-$TAG.XXXXXX")
chmod 755 "$TOP"
cp "$HERE/gpu_check.py" "$TOP/gpu_check.py" && chmod 644 "$TOP/gpu_check.py"
PROBE="$TOP/gpu_check.py"
SUMMARY="$TOP/summary.txt"
: >"$SUMMARY"
OWNER_A="arrpa$TAG" # pods of two owners, each running as its own account (runAs: owner)
OWNER_B="arrpb$TAG"
ADMIN="arrops$TAG" # a token only: reads everything
MPSU1="arrmps1$TAG"
MPSU2="arrmps2$TAG"
CREATED_USERS=()
SERVER_PID=""
AGENT_PID=""
MPS_STARTED=""
MPS_PIPE="$TOP/mps-pipe"
MPS_LOG="$TOP/mps-log"
RUN_ARRANGER_EXISTED=""
[ -e /run/arranger ] && RUN_ARRANGER_EXISTED=1
HAVE_SMI=""
HAVE_TORCH=""
ROOT_TORCH=""
NODE_GPUS=0
PORT=""
APORT=""
MPORT=""
ARR=()

# ---------------------------------------------------------------- helpers

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((START + BUDGET - $(date +%s))); }

hdr() {
  echo
  echo "=================================================================="
  echo "== $* (t=$(elapsed)s)"
  echo "=================================================================="
}

sub() { echo; echo "--- $* (t=$(elapsed)s)"; }

note() { echo "$*" >>"$SUMMARY"; } # a line for the summary printed at the end

# cap N: N seconds, or what is left of the budget if less (at least 5).
cap() {
  local want=$1 rest
  rest=$(left)
  [ "$rest" -lt "$want" ] && want=$rest
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}

# enough N: whether N seconds of budget are left; says so when not.
enough() {
  if [ "$(left)" -lt "$1" ]; then
    echo "SKIPPED: $(left)s of the ${BUDGET}s budget left, this step needs about $1s"
    return 1
  fi
}

# run T CMD...: show the command, run it with a timeout of T seconds, show its output and status.
run() {
  local t=$1 rc
  shift
  echo "\$ $*"
  timeout -k 3 "$t" "$@" 2>&1
  rc=$?
  case $rc in
    0) ;;
    124 | 137) echo "[TIMED OUT after ${t}s, rc=$rc]" ;;
    *) echo "[rc=$rc]" ;;
  esac
  return $rc
}

# sh_run T 'SHELL TEXT': as run, for a pipeline.
sh_run() {
  run "$1" bash -c "$2"
}

make_user() {
  local name=$1 out
  if id "$name" >/dev/null 2>&1; then
    echo "account $name exists already: not touching it"
    return 1
  fi
  if out=$(timeout 20 useradd -M -s /usr/sbin/nologin "$name" 2>&1); then
    CREATED_USERS+=("$name")
    mkdir -p "$TOP/home-$name" && chown "$name" "$TOP/home-$name"
    echo "made account $name ($(id "$name"))"
  else
    echo "useradd $name failed: $out"
    return 1
  fi
}

# kill_user_procs U: SIGKILL every process of an account this script made, by pid.
kill_user_procs() {
  local u=$1 pids
  pids=$(pgrep -u "$u" 2>/dev/null | tr '\n' ' ')
  if [ -n "$pids" ]; then
    echo "processes of $u left: $pids; killing them"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 1
  fi
}

# stop_pid PID NAME SECONDS: SIGTERM, wait, then SIGKILL it and its children.
stop_pid() {
  local pid=$1 name=$2 wait_s=$3 i kids
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || { echo "$name (pid $pid) had already exited"; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < wait_s * 5; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    kids=$(pgrep -P "$pid" | tr '\n' ' ')
    echo "$name (pid $pid) still running after ${wait_s}s: SIGKILL $pid $kids"
    # shellcheck disable=SC2086
    kill -KILL $kids "$pid" 2>/dev/null
  else
    echo "$name (pid $pid) stopped"
  fi
  wait "$pid" 2>/dev/null
}

# mps_procs: the MPS daemons and servers running (by their program: a process's short name
# is cut to 15 characters, "nvidia-cuda-mps", so pgrep -x cannot tell them apart).
mps_procs() {
  ps -eo pid=,user=,args= | awk '$3 ~ /nvidia-cuda-mps-(control|server)$/ { print }'
}

mpsctl() { # mpsctl 'COMMAND': one command to the MPS control daemon, its answer printed
  echo "\$ echo '$1' | nvidia-cuda-mps-control"
  echo "$1" | CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" \
    timeout -k 2 10 nvidia-cuda-mps-control 2>&1
  local rc=$?
  echo "[rc=$rc]"
  return $rc
}

mps_quiet() { # the daemon's answer alone
  echo "$1" | CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" \
    timeout -k 2 10 nvidia-cuda-mps-control 2>/dev/null
}

# as_user U T [VAR=VALUE...] -- ARGS: run a probe as U (runuser), under MPS's directories.
as_user() {
  local u=$1 t=$2
  shift 2
  local vars=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  (cd "$TOP" && timeout -k 5 "$t" runuser -u "$u" -- env HOME="$TOP/home-$u" \
    CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" "${vars[@]}" \
    "$POD_PY" "$PROBE" "$@")
}

# user_python U: whether U can run $POD_PY and import torch with it (where root can).
user_python() {
  local u=$1 out rc
  out=$(cd "$TOP" && timeout -k 5 "$(cap 90)" runuser -u "$u" -- env HOME="$TOP/home-$u" "$POD_PY" -c '
import sys
print("python", sys.version.split()[0], end="; ")
try:
    import torch
    print("torch", torch.__version__)
except Exception as exc:
    print("no torch:", type(exc).__name__, exc)' 2>&1)
  rc=$?
  echo "as $u: $POD_PY: rc=$rc: $out"
  [ "$rc" -eq 0 ] || return 1
  if [[ $out == *"no torch"* ]] && [ -n "$ROOT_TORCH" ]; then return 1; fi
  return 0
}

show_run() { # show_run FILE RC: a probe's output and how it ended
  echo "~~ $(basename "$1") (rc=$2$([ "$2" = 124 ] || [ "$2" = 137 ] && echo ', TIMED OUT'))"
  sed 's/^/   | /' "$1"
}

shutdown_servers() {
  local pids pid i
  pids=$(mps_quiet get_server_list | grep -Eo '^[0-9]+' | tr '\n' ' ')
  echo "MPS servers now: ${pids:-none}"
  for pid in $pids; do mpsctl "shutdown_server $pid"; done
  for ((i = 0; i < 20; i++)); do
    mps_quiet get_server_list | grep -Eq '^[0-9]+' || break
    sleep 0.5
  done
  pids=$(mps_quiet get_server_list | grep -Eo '^[0-9]+' | tr '\n' ' ')
  echo "MPS servers after shutdown: ${pids:-none}"
}

stop_arranger() {
  if [ -n "$AGENT_PID" ]; then
    stop_pid "$AGENT_PID" "arranger agent" 25
    AGENT_PID=""
  fi
  if [ -n "$SERVER_PID" ]; then
    stop_pid "$SERVER_PID" "arranger server" 15
    SERVER_PID=""
  fi
}

stop_mps() {
  [ -n "$MPS_STARTED" ] || return 0
  MPS_STARTED=""
  mpsctl quit
  local i
  for ((i = 0; i < 25; i++)); do
    [ -z "$(mps_procs)" ] && break
    sleep 0.4
  done
  echo "MPS processes after quit: $(mps_procs | tr '\n' ';')"
  [ -d "$MPS_LOG" ] && cp -r "$MPS_LOG" "$OUT/gpu_check_logs/mps-log" 2>/dev/null
}

CLEANED=""
# shellcheck disable=SC2329  # called by the EXIT trap
cleanup() {
  [ -n "$CLEANED" ] && return
  CLEANED=1
  trap '' PIPE INT TERM HUP # finish cleaning up whatever arrives now
  hdr "summary"
  cat "$SUMMARY" 2>/dev/null
  hdr "cleanup"
  mkdir -p "$OUT/gpu_check_logs"
  stop_arranger
  stop_mps
  for f in server.log agent.log; do
    [ -f "$TOP/$f" ] && cp "$TOP/$f" "$OUT/gpu_check_logs/$f"
  done
  local u
  for u in "${CREATED_USERS[@]}"; do
    kill_user_procs "$u"
    if timeout 20 userdel "$u" 2>&1; then echo "removed account $u"; else echo "userdel $u failed"; fi
  done
  if [ -z "$RUN_ARRANGER_EXISTED" ] && [ -d /run/arranger ]; then
    rm -rf /run/arranger && echo "removed /run/arranger (the agent's compiled launcher and shim)"
  fi
  echo "cgroups of ours left: $(find /sys/fs/cgroup -maxdepth 4 -type d -path '*arranger/gpu-check*' 2>/dev/null | tr '\n' ' ')"
  rm -rf "$TOP"
  echo "gpu_check done in $(elapsed)s; report: $REPORT"
  exec 1>&- 2>&- # let tee write its last lines before this script ends
  local i
  for ((i = 0; i < 50; i++)); do
    kill -0 "$TEE_PID" 2>/dev/null || break
    sleep 0.1
  done
}
trap cleanup EXIT
trap 'echo "interrupted: cleaning up"; exit 130' INT TERM HUP

mkdir -p "$OUT/gpu_check_logs"
echo "gpu_check.sh $(date -u +%FT%TZ) host=$(hostname) budget=${BUDGET}s tmp=$TOP tag=$TAG"

# ---------------------------------------------------------------- 1. facts

section_facts() {
  hdr "1. facts"
  run 5 id
  run 5 uname -a
  [ -r /etc/os-release ] && grep -E '^(PRETTY_NAME)=' /etc/os-release
  run 5 nproc
  run 5 free -g
  echo "python3: ${PY:-MISSING}"
  if command -v nvidia-smi >/dev/null; then
    HAVE_SMI=1
    run 20 nvidia-smi -L
    run 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode,mig.mode.current,persistence_mode --format=csv
    run 20 nvidia-smi
  else
    echo "nvidia-smi: NOT FOUND (no NVIDIA driver tools here: GPU steps will say what they cannot do)"
  fi
  [ -r /proc/driver/nvidia/version ] && run 5 cat /proc/driver/nvidia/version
  sh_run 5 'ls -l /dev/nvidia* /dev/nvidia-caps 2>&1'
  sh_run 5 'grep -i nvidia /proc/devices'
  echo "cgroup fs type: $(stat -fc %T /sys/fs/cgroup 2>&1)"
  note "1. GPUs: $({ [ -n "$HAVE_SMI" ] && timeout 20 nvidia-smi -L 2>&1; } | tr '\n' ' ' | cut -c1-200); /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup 2>&1); kernel $(uname -r)"
  run 5 cat /proc/self/cgroup
  sh_run 5 'grep cgroup /proc/self/mounts'
  local sc=/sys/fs/cgroup/cgroup.subtree_control
  if [ -f "$sc" ]; then
    echo "cgroup v2: cgroup.controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
    echo "cgroup v2: cgroup.subtree_control: $(cat "$sc")"
    [ -w "$sc" ] && echo "cgroup.subtree_control: writable (test -w)" || echo "cgroup.subtree_control: NOT writable (test -w)"
  else
    echo "no /sys/fs/cgroup/cgroup.subtree_control: not a cgroup-v2 root (v1 or hybrid)"
    sh_run 5 'ls /sys/fs/cgroup'
  fi
  local probe="/sys/fs/cgroup/gpu-check-$TAG"
  [ -d /sys/fs/cgroup/devices ] && probe="/sys/fs/cgroup/devices/gpu-check-$TAG"
  if mkdir "$probe" 2>/dev/null; then
    echo "made and removed a cgroup at $probe: the hierarchy is writable"
    rmdir "$probe"
  else
    echo "cannot make a cgroup at $probe: $(mkdir "$probe" 2>&1)"
  fi
  sh_run 5 'cat /proc/sys/kernel/pid_max; cat /proc/sys/kernel/unprivileged_bpf_disabled 2>/dev/null; grep -E "^CapEff" /proc/self/status'
  for tool in setpriv runuser useradd userdel cc gcc bpftool nvidia-cuda-mps-control nvidia-cuda-mps-server arranger; do
    printf '  %-24s %s\n' "$tool" "$(command -v "$tool" || echo MISSING)"
  done
  echo "MPS processes before this check: $(mps_procs | tr '\n' ';')"
  if [ -n "$PY" ]; then
    sub "python facts (imports, NVML, bpf(2) device program, torch as root)"
    run "$(cap 60)" "$PY" "$PROBE" facts | tee "$TOP/facts.out"
    grep -q '"available": true' "$TOP/facts.out" && HAVE_TORCH=1
    grep -q '^torch (as root): {"version"' "$TOP/facts.out" && ROOT_TORCH=1
    note "1. $(grep -m1 '^bpf(2)' "$TOP/facts.out")"
    note "1. $(grep -m1 '^torch (as root)' "$TOP/facts.out")"
    [ "$POD_PY" != "$PY" ] && echo "probes in pods and MPS clients run $POD_PY (GPU_CHECK_PYTHON)"
  fi
  return 0
}

# ---------------------------------------------------------------- 2. arranger on the GPU

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

section_arranger() {
  hdr "2. arranger: a TLS server, tokens for two owners and an admin, one root agent with runAs: owner"
  if command -v arranger >/dev/null; then
    ARR=(arranger)
  elif "$PY" -c 'import arranger' 2>/dev/null; then
    ARR=("$PY" -c 'import sys; from arranger.client.cli import main; sys.exit(main())')
  else
    echo "FAILED: neither \`arranger\` on PATH nor arranger importable by $PY (PYTHONPATH=${PYTHONPATH:-})"
    return 1
  fi
  echo "arranger: ${ARR[*]} ($("${ARR[@]}" --version 2>&1 | head -1))"
  command -v setpriv >/dev/null || { echo "FAILED: no setpriv: a root agent cannot run pods as their owners"; return 1; }
  local u
  for u in "$OWNER_A" "$OWNER_B"; do
    make_user "$u" || { echo "FAILED: no account $u for pods"; return 1; }
    user_python "$u" || echo "WARNING: $u cannot run $POD_PY with torch: GPU probes in its pods will say so"
  done
  PORT=$(free_port) && APORT=$(free_port) && MPORT=$(free_port) || { echo "FAILED: no free port"; return 1; }
  mkdir -p "$TOP/server" "$TOP/agent" "$TOP/meet" "$TOP/meet2" && chmod 1777 "$TOP/meet" "$TOP/meet2"
  run 60 "${ARR[@]}" certs --out "$TOP/tls" --server-host 127.0.0.1 --agent gpu-check >/dev/null || return 1
  printf '%s\n' "listen: 127.0.0.1:$PORT" "agentListen: 127.0.0.1:$APORT" 'httpListen: ""' \
    "dataDir: $TOP/server" \
    "tls: {ca: $TOP/tls/ca.pem, cert: $TOP/tls/server.pem, key: $TOP/tls/server.key}" \
    >"$TOP/server.yaml"
  run 30 "${ARR[@]}" server --config "$TOP/server.yaml" --init || return 1
  local who role
  for who in "$OWNER_A:user" "$OWNER_B:user" "$ADMIN:admin"; do
    u=${who%%:*}
    role=${who#*:}
    (umask 077 && timeout 30 "${ARR[@]}" token create --user "$u" --role "$role" \
      --data-dir "$TOP/server" "$u" 2>/dev/null | tail -1 >"$TOP/token-$u")
    grep -q '^arr_' "$TOP/token-$u" && echo "token for $u ($role)" || { echo "FAILED: token for $u"; return 1; }
  done
  timeout -k 5 900 "${ARR[@]}" server --config "$TOP/server.yaml" --log-level info \
    >"$TOP/server.log" 2>&1 &
  SERVER_PID=$!
  echo "server pid $SERVER_PID on 127.0.0.1:$PORT (agents 127.0.0.1:$APORT)"
  printf '%s\n' "server: 127.0.0.1:$APORT" \
    "tls: {ca: $TOP/tls/ca.pem, cert: $TOP/tls/gpu-check.pem, key: $TOP/tls/gpu-check.key}" \
    'runAs: owner' 'podman: false' 'usageIntervalSeconds: 2' "httpListen: 127.0.0.1:$MPORT" \
    >"$TOP/agent.yaml"
  if command -v nvidia-cuda-mps-control >/dev/null && [ -z "${GPU_CHECK_FAKE_GPUS:-}" ]; then
    echo "gpuSharing: mps" >>"$TOP/agent.yaml" # each 0.5 pod of section 3 gets its own daemon
  fi
  sed 's/^/   | /' "$TOP/agent.yaml"
  local extra=()
  if [ -n "${GPU_CHECK_FAKE_GPUS:-}" ]; then # for trying this script on a machine without GPUs
    echo "GPU_CHECK_FAKE_GPUS=$GPU_CHECK_FAKE_GPUS: the agent declares that many fake GPUs"
    extra+=(--fake-gpus "$GPU_CHECK_FAKE_GPUS")
  elif ! "$PY" -c 'import pynvml' 2>/dev/null && [ -n "$HAVE_SMI" ]; then
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    echo "pynvml is not importable: the agent cannot see the GPUs through NVML; declaring $n"
    echo "fake GPU(s) instead (index i = minor i; compare with ls -l /dev/nvidia* above)"
    extra+=(--fake-gpus "$n")
  fi
  local i
  timeout -k 5 900 "${ARR[@]}" agent --config "$TOP/agent.yaml" \
    --node-name gpu-check --address 127.0.0.1 --data-dir "$TOP/agent" --stop-pods \
    --log-level debug "${extra[@]}" >"$TOP/agent.log" 2>&1 &
  AGENT_PID=$!
  echo "agent pid $AGENT_PID ${extra[*]} (metrics on 127.0.0.1:$MPORT)"
  ARR+=(--server "127.0.0.1:$PORT" --ca "$TOP/tls/ca.pem")
  local ready=""
  for ((i = 0; i < 100; i++)); do
    if as_arr "$ADMIN" nodes 2>/dev/null | grep -q 'gpu-check.*Ready'; then ready=1; break; fi
    kill -0 "$AGENT_PID" 2>/dev/null || break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.4
  done
  [ -n "$ready" ] && echo "agent registered after $(elapsed)s" || echo "FAILED: the agent did not register (see its log below)"
  run 20 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" nodes
  echo "\$ arranger nodes -o json"
  timeout 20 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" nodes -o json >"$TOP/nodes.json" 2>&1
  cat "$TOP/nodes.json"
  NODE_GPUS=$("$PY" -c '
import json, sys
try:
    nodes = json.load(open(sys.argv[1]))
    print(sum(len(n.get("gpus", [])) for n in nodes))
except Exception:
    print(0)' "$TOP/nodes.json")
  echo "GPUs the node reports: $NODE_GPUS"
  note "2. node: $NODE_GPUS GPU(s), pods as their owners ($OWNER_A, $OWNER_B); $(as_arr "$ADMIN" nodes 2>&1 | grep gpu-check | tr -s ' ' | cut -c1-200)"
  note "2. gpuSharing: $(tr -d '\n' <"$TOP/nodes.json" | tr -s ' ' | grep -o '"gpuSharing": {[^}]*}')"
  sub "agent log (cgroups, device filter, GPUs; debug level)"
  sed 's/^/   | /' "$TOP/agent.log" | head -60
  sub "server log (head)"
  sed 's/^/   | /' "$TOP/server.log" | head -20
  [ -n "$ready" ]
}

# as_arr U ARGS...: the CLI with U's token.
as_arr() {
  local u=$1
  shift
  "${ARR[@]}" --token-file "$TOP/token-$u" "$@"
}

# ---------------------------------------------------------------- 3. isolation via arranger jobs

job_yaml() { # job_yaml NAME RESOURCES PROBE-ARGS...
  local name=$1 resources=$2 args
  shift 2
  args=$(printf ', "%s"' "$@")
  printf '%s\n' "apiVersion: arranger/v1" "kind: TYJob" "metadata:" "  name: $name" "spec:" \
    "  restartLimit: 0" "  leader:" "    name: probe" "    template:" \
    "      command: [$POD_PY, $PROBE, pod$args]" "      resources: $resources"
}

# unfinished NAME...: how many of the jobs have not Succeeded or Failed (one `list` call).
unfinished() {
  as_arr "$ADMIN" list --all -o json 2>/dev/null | "$PY" -c '
import json, sys
try:
    jobs = {j["name"]: j.get("progress", {}).get("stage", "") for j in json.load(sys.stdin)}
except Exception:
    jobs = {}
print(sum(jobs.get(name) not in ("Succeeded", "Failed") for name in sys.argv[1:]))' "$@"
}

job_stage() {
  as_arr "$ADMIN" get "$1" -o json 2>/dev/null | "$PY" -c '
import json, sys
try:
    job = json.load(sys.stdin)
    status = job.get("status", {})
    print(status.get("stage", "?"), status.get("reason", ""), "|", status.get("message", ""))
except Exception as exc:
    print("?", exc)'
}

metrics() { # the agent's per-pod lines of /metrics
  "$PY" -c '
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
print("\n".join(line for line in text.splitlines() if line.startswith("arranger_pod_")))' \
    "http://127.0.0.1:$MPORT/metrics" 2>&1 | head -40
}

section_isolation() {
  hdr "3. isolation of pods on the real GPU (pods run as their owners)"
  [ -n "$AGENT_PID" ] || { echo "SKIPPED: no agent (section 2 failed)"; return 1; }
  local specs=("$OWNER_A|nogpu|{cpu: 1, memory: 16Gi}|nogpu" "$OWNER_A|pids|{cpu: 1, memory: 1Gi, pids: 64}|pids")
  if [ "$NODE_GPUS" -gt 0 ]; then
    specs=("$OWNER_A|gpu|{cpu: 1, memory: 16Gi, gpu: 1}|gpu" "${specs[@]}")
    if tr -d '\n' <"$TOP/nodes.json" | grep -q '"gpuSharing": {[^}]*"enforced": true'; then
      # share1 and share2: two owners' halves of the GPU at once, each measuring its matmuls
      # once both are ready (two daemons); share3 and share4: one owner's two halves at once
      # (one daemon, its server running both); shareraised: a half that raised its own MPS
      # variables, alone, whose daemon is then killed.
      specs+=("$OWNER_A|share1|{cpu: 1, memory: 8Gi, gpu: 0.5}|share $TOP/meet 2"
        "$OWNER_B|share2|{cpu: 1, memory: 8Gi, gpu: 0.5}|share $TOP/meet 2"
        "$OWNER_A|share3|{cpu: 1, memory: 8Gi, gpu: 0.5}|share $TOP/meet2 2"
        "$OWNER_A|share4|{cpu: 1, memory: 8Gi, gpu: 0.5}|share $TOP/meet2 2"
        "$OWNER_A|shareraised|{cpu: 1, memory: 8Gi, gpu: 0.5}|share-raised $TOP/hold")
      mkdir -p "$TOP/hold" && chmod 755 "$TOP/hold" && touch "$TOP/hold/hold"
    else
      echo "the node does not enforce GPU shares (no MPS here?): no 0.5 pods submitted"
    fi
  else
    echo "the node reports no GPU: the one-GPU job is not submitted (it could never be placed)"
  fi
  local spec owner name resources args jobs=()
  for spec in "${specs[@]}"; do
    IFS='|' read -r owner name resources args <<<"$spec"
    # shellcheck disable=SC2086  # the probe's arguments are words
    job_yaml "gpucheck-$name" "$resources" $args >"$TOP/$name.yaml"
    jobs+=("gpucheck-$name")
    sub "submit gpucheck-$name as $owner"
    sed 's/^/   | /' "$TOP/$name.yaml"
    run 20 "${ARR[@]}" --token-file "$TOP/token-$owner" submit "$TOP/$name.yaml"
  done
  local deadline=$(($(date +%s) + $(cap 180))) pending running seen="" since=0 shot="" shots=0 i
  while :; do
    pending=$(unfinished "${jobs[@]}")
    running=$(as_arr "$ADMIN" list 2>/dev/null | awk '/Running/ { print $1 }' | sort | tr '\n' ' ')
    if [ "$running" != "$seen" ]; then
      seen=$running
      since=$(date +%s)
      shot=""
    fi
    # a picture of each set of running pods once it has run 3 s (usage is sampled every 2 s)
    if [ -n "${running// /}" ] && [ -z "$shot" ] && [ $(($(date +%s) - since)) -ge 3 ] && [ "$shots" -lt 5 ]; then
      shot=1
      shots=$((shots + 1))
      sub "while $running run"
      run 10 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" list
      run 15 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" top --once
      echo "\$ the agent's /metrics, per pod"
      metrics
      echo "MPS processes (the agent's daemons for 0.5 pods): $(mps_procs | tr '\n' ';')"
      [ -n "$HAVE_SMI" ] && run 10 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    fi
    if [ -e "$TOP/hold/hold" ] && [ "$running" = "gpucheck-shareraised " ] &&
      as_arr "$ADMIN" logs gpucheck-shareraised 2>/dev/null | grep -q 'holding while'; then
      daemon_gone
    fi
    [ "$pending" -eq 0 ] && break
    [ "$(date +%s)" -ge "$deadline" ] && { echo "DEADLINE: $pending job(s) not finished"; break; }
    sleep 1
  done
  rm -f "$TOP/hold/hold"
  sub "the node once every pod ended (shares enforced again?)"
  if [ -d "$TOP/hold" ]; then # shares were held: the next heartbeat says so again
    wait_shares yes 15 >/dev/null
  fi
  run 20 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" nodes
  note "3. after every pod ended, shares enforced: $(shares_held)"
  local j
  for j in "${jobs[@]}"; do
    sub "job $j: $(job_stage "$j")"
    run 15 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" get "$j"
    run 15 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" logs "$j" | sed 's/^/   | /'
  done
  sub "expected: gpu opens /dev/nvidia0 and runs the matmul; nogpu gets EPERM on every NVIDIA node and no CUDA; pids forks fewer than 64"
  echo "expected of share1, share2, shareraised (0.5 each, where submitted): alloc_0.4 ok, alloc_0.6 an out-of-memory error, greedy_gib near half the card; share1 and share2 (two owners, two daemons) and share3 and share4 (one owner, one daemon) met and ran their matmuls at once; their matmuls_per_s against gpu's (the whole card alone) and shareraised's (a half alone): the cost of sharing"
  local line
  for j in "${jobs[@]}"; do
    line="$j: $(job_stage "$j" | cut -c1-120) $(as_arr "$ADMIN" logs "$j" 2>/dev/null | grep '^RESULT ' | tail -1)"
    echo "$line"
    note "3. $line"
  done
  sub "agent log since the jobs (warnings, errors, MPS, pod lines)"
  grep -Ein 'warn|error|mps|share|device|cgroup|pids' "$TOP/agent.log" | tail -40 | sed 's/^/   | /'
  sub "stopping the agent (it stops its pods) and the server"
  stop_arranger
  echo "MPS processes after the agent stopped its pods (expected: none of its daemons): $(mps_procs | tr '\n' ';')"
  kill_user_procs "$OWNER_A"
  kill_user_procs "$OWNER_B"
  return 0
}

shares_held() { # yes or no: what the node says of its GPU shares (JSON leaves a false out)
  as_arr "$ADMIN" nodes -o json 2>/dev/null | "$PY" -c '
import json, sys
try:
    nodes = json.load(sys.stdin)
    print("yes" if nodes[0].get("gpuSharing", {}).get("enforced") else "no")
except Exception as exc:
    print("unknown", exc)'
}

# wait_shares WANT S: wait at most S seconds until the node says its shares are held (yes) or
# not (no); prints the seconds it took, fails past S.
wait_shares() {
  local i
  for ((i = 0; i < $2 * 2; i++)); do
    [ "$(shares_held)" = "$1" ] && { echo $((i / 2)); return 0; }
    sleep 0.5
  done
  echo "$2"
  return 1
}

# daemon_gone: while gpucheck-shareraised holds (its probe waits on $TOP/hold/hold), SIGKILL
# the MPS control daemon the agent started for it; the node must say its shares are not held
# (gpuSharing.enforced false, an event) and the pod must run on; then let the probe go on.
daemon_gone() {
  sub "the MPS control daemon of gpucheck-shareraised killed while its pod runs"
  local pids i took
  pids=$(pgrep -u "$OWNER_A" -f 'nvidia-cuda-mps-control' | tr '\n' ' ')
  echo "MPS processes: $(mps_procs | tr '\n' ';')"
  if [ -z "$pids" ]; then
    echo "no control daemon of $OWNER_A found"
  else
    echo "\$ kill -KILL $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids
    took=$(wait_shares no 30) && echo "the node says its shares are not enforced after $took s" ||
      echo "FAILED: the node still says its shares are enforced after 30 s"
    run 20 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" nodes
    echo "\$ arranger events (the newest)"
    as_arr "$ADMIN" events 2>&1 | grep -i 'share\|gpu-check' | tail -6
    run 15 "${ARR[@]}" --token-file "$TOP/token-$ADMIN" list
    note "3. daemon killed: shares enforced: $(shares_held) (said after $took s); events: $(as_arr "$ADMIN" events 2>&1 | grep -i 'GpuShares' | tail -2 | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
    # A new pod of the group (same owner, same share): no new share goes to the node while it
    # says its shares are not held, so it is placed once the stalled half has ended, under a
    # fresh daemon.
    job_yaml gpucheck-sharenext "{cpu: 1, memory: 8Gi, gpu: 0.5}" share >"$TOP/sharenext.yaml"
    run 20 "${ARR[@]}" --token-file "$TOP/token-$OWNER_A" submit "$TOP/sharenext.yaml"
    took=$(wait_shares yes 60) && echo "enforced again after $took s (the group's pods ended)" ||
      echo "FAILED: not enforced again within 60 s"
    for ((i = 0; i < 120; i++)); do
      [ "$(unfinished gpucheck-sharenext)" -eq 0 ] && break
      sleep 0.5
    done
    note "3. the group's next pod: enforced again: $(shares_held); $(as_arr "$ADMIN" logs gpucheck-sharenext 2>/dev/null | grep '^RESULT ' | grep -o '"alloc_0.[46]": "[^"]\{0,40\}\|"matmuls_per_s": [0-9.]*\|"error": "[^"]\{0,80\}' | tr '\n' ' ')"
  fi
  rm -f "$TOP/hold/hold"
  echo "MPS processes after: $(mps_procs | tr '\n' ';')"
}

# ---------------------------------------------------------------- 5. the cost of sharing unenforced

section_unshared() {
  hdr "5. no MPS: two plain processes of root on the GPU at once (time-sliced, unheld), 3 s each"
  [ -n "$HAVE_SMI" ] || { echo "SKIPPED: no NVIDIA driver"; return 1; }
  enough 40 || return 1
  local t p1 p2 rc1 rc2
  t=$(cap 60)
  (cd "$TOP" && timeout -k 5 "$t" "$POD_PY" "$PROBE" mps 3 plain-1 >"$TOP/u1.out" 2>&1) &
  p1=$!
  (cd "$TOP" && timeout -k 5 "$t" "$POD_PY" "$PROBE" mps 3 plain-2 >"$TOP/u2.out" 2>&1) &
  p2=$!
  wait "$p1"; rc1=$?
  wait "$p2"; rc2=$?
  show_run "$TOP/u1.out" "$rc1"
  show_run "$TOP/u2.out" "$rc2"
  "$PY" "$PROBE" verdict "$TOP/u1.out" "$TOP/u2.out" | tee "$TOP/u.verdict"
  note "5. two plain processes, no MPS: $(grep VERDICT "$TOP/u.verdict"); $(grep -h '^  u[12].out' "$TOP/u.verdict" | tr -s ' ' | tr '\n' ';')"
  return 0
}

# ---------------------------------------------------------------- 4. MPS across owners

section_mps() {
  hdr "4. MPS across owners"
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "SKIPPED: nvidia-cuda-mps-control not found"
    return 1
  fi
  [ -n "$HAVE_TORCH" ] || echo "note: torch as root saw no CUDA GPU in section 1; the probes below will say what fails"
  if [ -n "$(mps_procs)" ]; then
    echo "SKIPPED: MPS already runs on this machine (not ours: left alone): $(mps_procs | tr '\n' ';')"
    return 1
  fi
  mkdir -p "$MPS_PIPE" "$MPS_LOG" && chmod 1777 "$MPS_PIPE" "$MPS_LOG"
  local cross=1
  make_user "$MPSU1" && make_user "$MPSU2" || cross=""
  if [ -n "$cross" ] && ! user_python "$MPSU1"; then
    echo "$MPSU1 cannot run $POD_PY with torch: 4a (two owners) is skipped, 4b-4d run as root"
    cross=""
  fi
  [ -n "$cross" ] || { MPSU1=root; mkdir -p "$TOP/home-root"; }
  echo "\$ CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE CUDA_MPS_LOG_DIRECTORY=$MPS_LOG nvidia-cuda-mps-control -d"
  if CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOG" \
    timeout 15 nvidia-cuda-mps-control -d </dev/null >/dev/null 2>&1; then
    MPS_STARTED=1
  else
    echo "FAILED to start the MPS control daemon (rc=$?)"
    note "4. the MPS control daemon did not start"
    sed 's/^/   | /' "$MPS_LOG"/control.log 2>/dev/null
    return 1
  fi
  sleep 1
  echo "MPS processes: $(mps_procs | tr '\n' ';')"
  mpsctl get_server_list
  mpsctl get_default_active_thread_percentage

  # 4a: two owners at once
  sub "4a. $MPSU1 and $MPSU2 at once: 2 s of bf16 4096^2 matmuls each (timeout 60 each)"
  if [ -z "$cross" ]; then
    echo "SKIPPED: no two accounts that can run the probe (see above)"
  elif enough 40; then
    local t rc1 rc2 p1 p2
    t=$(cap 60)
    as_user "$MPSU1" "$t" -- mps 2 "a-$MPSU1" >"$TOP/a1.out" 2>&1 &
    p1=$!
    as_user "$MPSU2" "$t" -- mps 2 "a-$MPSU2" >"$TOP/a2.out" 2>&1 &
    p2=$!
    sleep 6
    echo "after 6 s:"
    mpsctl get_server_list
    run 15 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    run 15 nvidia-smi
    wait "$p1"; rc1=$?
    wait "$p2"; rc2=$?
    show_run "$TOP/a1.out" "$rc1"
    show_run "$TOP/a2.out" "$rc2"
    "$PY" "$PROBE" verdict "$TOP/a1.out" "$TOP/a2.out" | tee "$TOP/a.verdict"
    note "4a. two owners: $(grep VERDICT "$TOP/a.verdict")"
    note "4a. $(grep -h '^  a[12].out' "$TOP/a.verdict" | tr -s ' ' | tr '\n' ';')"
    mpsctl get_server_list
  fi

  # 4b: one owner, two clients at 50 %
  sub "4b. $MPSU1: two clients at once with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 (2 s each)"
  if enough 35; then
    local t rc1 rc2 p1 p2
    t=$(cap 60)
    as_user "$MPSU1" "$t" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 -- mps 2 b-50-1 >"$TOP/b1.out" 2>&1 &
    p1=$!
    as_user "$MPSU1" "$t" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 -- mps 2 b-50-2 >"$TOP/b2.out" 2>&1 &
    p2=$!
    wait "$p1"; rc1=$?
    wait "$p2"; rc2=$?
    show_run "$TOP/b1.out" "$rc1"
    show_run "$TOP/b2.out" "$rc2"
    "$PY" "$PROBE" verdict "$TOP/b1.out" "$TOP/b2.out" | tee "$TOP/b.verdict"
    note "4b. two 50 % clients: $(grep VERDICT "$TOP/b.verdict")"
    note "4b. $(grep -h '^  b[12].out' "$TOP/b.verdict" | tr -s ' ' | tr '\n' ';')"
    echo "(compare each client's matmuls/s with a solo client's in 4a)"
  fi

  # 4c: active thread percentage set by the daemon
  sub "4c. set_default_active_thread_percentage 25, then a client without and with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"
  if enough 30; then
    local t
    shutdown_servers
    mpsctl "set_default_active_thread_percentage 25"
    mpsctl get_default_active_thread_percentage
    t=$(cap 45)
    as_user "$MPSU1" "$t" -- mps 1.5 c-default25 >"$TOP/c1.out" 2>&1
    show_run "$TOP/c1.out" $?
    mpsctl get_server_list
    as_user "$MPSU1" "$t" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 -- mps 1.5 c-default25-env100 >"$TOP/c2.out" 2>&1
    show_run "$TOP/c2.out" $?
    note "4c. default 25 %: $(grep -h '^RESULT' "$TOP/c1.out" "$TOP/c2.out" | grep -o '"error": "[^"]*"\|"per_s": [0-9.]*\|"sms": [0-9]*\|"tag": "[^"]*"' | tr '\n' ' ')"
  fi
  sub "4c'. per-server set_active_thread_percentage <server pid> 25 (default back to 100 first)"
  if enough 30; then
    local t rc1 rc2 p1 pid="" i
    mpsctl "set_default_active_thread_percentage 100"
    shutdown_servers
    t=$(cap 45)
    as_user "$MPSU1" "$t" -- mps 8 c-holder >"$TOP/c3.out" 2>&1 &
    p1=$!
    for ((i = 0; i < 60; i++)); do
      pid=$(mps_quiet get_server_list | grep -Eo '^[0-9]+' | head -1)
      [ -n "$pid" ] && break
      kill -0 "$p1" 2>/dev/null || break
      sleep 0.5
    done
    if [ -n "$pid" ]; then
      echo "MPS server pid: $pid"
      mpsctl "get_active_thread_percentage $pid"
      mpsctl "set_active_thread_percentage $pid 25"
      mpsctl "get_active_thread_percentage $pid"
      as_user "$MPSU1" "$t" -- mps 1.5 c-after-set25 >"$TOP/c4.out" 2>&1
      rc2=$?
    else
      echo "no MPS server was listed while c-holder ran"
      rc2=none
    fi
    wait "$p1"; rc1=$?
    show_run "$TOP/c3.out" "$rc1"
    [ -f "$TOP/c4.out" ] && show_run "$TOP/c4.out" "$rc2"
    echo "(c-holder started before the set; c-after-set25 after it: compare SMs seen and rates)"
    note "4c'. per-server 25 %: $(grep -h '^RESULT' "$TOP/c3.out" "$TOP/c4.out" 2>/dev/null | grep -o '"error": "[^"]*"\|"per_s": [0-9.]*\|"sms": [0-9]*\|"tag": "[^"]*"' | tr '\n' ' ')"
  fi

  # 4d: pinned device memory limit
  sub "4d. set_default_device_pinned_mem_limit 0 2G; clients allocate 1 GiB then 3 GiB (no env, env 0=8G, env 0=1G)"
  if enough 25; then
    local t rc1 rc2 rc3 p1 p2 p3
    shutdown_servers
    mpsctl "set_default_device_pinned_mem_limit 0 2G"
    mpsctl "get_default_device_pinned_mem_limit 0"
    t=$(cap 60)
    as_user "$MPSU1" "$t" -- mpsmem d-noenv >"$TOP/d1.out" 2>&1 &
    p1=$!
    as_user "$MPSU1" "$t" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G -- mpsmem d-env-0=8G >"$TOP/d2.out" 2>&1 &
    p2=$!
    as_user "$MPSU1" "$t" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G -- mpsmem d-env-0=1G >"$TOP/d3.out" 2>&1 &
    p3=$!
    wait "$p1"; rc1=$?
    wait "$p2"; rc2=$?
    wait "$p3"; rc3=$?
    show_run "$TOP/d1.out" "$rc1"
    show_run "$TOP/d2.out" "$rc2"
    show_run "$TOP/d3.out" "$rc3"
    echo "(the limit holds against the client if d-env-0=8G cannot allocate 3 GiB)"
    local f
    for f in "$TOP"/d[123].out; do
      note "4d. $(grep -h '^RESULT' "$f" | grep -o '"tag": "[^"]*"\|"alloc_[13]g": "[^"]*"\|"error": "[^"]*"\|"mem_get_info_gib": [^]]*]' | tr '\n' ' ')"
    done
  fi

  sub "MPS logs"
  for f in "$MPS_LOG"/control.log "$MPS_LOG"/server.log; do
    [ -f "$f" ] && { echo "~~ $f (last 40 lines)"; tail -40 "$f" | sed 's/^/   | /'; }
  done
  run 5 ls -la "$MPS_PIPE" "$MPS_LOG"
  sub "stopping the MPS daemon"
  stop_mps
  return 0
}

# ---------------------------------------------------------------- run

SECTIONS=" ${GPU_CHECK_SECTIONS:-1 2 3 5 4} " # which to run (1 and 2 are needed by the rest)
want() { [[ $SECTIONS == *" $1 "* ]]; }

section_facts || echo "section 1 ended with a failure (continuing)"
if [ -z "$PY" ]; then
  echo "no python3 on PATH: sections 2-4 need it"
else
  section_arranger || echo "section 2 ended with a failure (continuing)"
  want 3 && { section_isolation || echo "section 3 ended with a failure (continuing)"; }
  want 5 && { section_unshared || echo "section 5 ended with a failure (continuing)"; }
  if ! want 4; then
    echo "section 4 not asked for (GPU_CHECK_SECTIONS=$SECTIONS)"
  elif [ -n "$HAVE_SMI" ]; then
    section_mps || echo "section 4 ended with a failure (continuing)"
  else
    hdr "4. MPS across owners"
    echo "SKIPPED: no nvidia-smi, so no NVIDIA driver here"
  fi
fi
exit 0
