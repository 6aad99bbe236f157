#!/usr/bin/env bash
# gpu_check.sh: one pass over a lent GPU machine, as root, that records what Arranger's pod
# confinement does on a real NVIDIA GPU and how NVIDIA MPS behaves across owners. Run once,
# from the repository root, with Arranger importable (PYTHONPATH) and `arranger` on PATH:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH && timeout -k 20 300 bash bench/gpu_check.sh
#
# Sections: 1 facts (GPU, driver, device nodes, cgroups, bpf); 2 a server and one root agent on
# 127.0.0.1 that finds the GPU through NVML; 3 three one-pod jobs (one GPU, no GPU, a pids
# limit of 64) run as a throw-away user; 4 MPS: two users at once, two 50 % clients, active
# thread percentages, a pinned device memory limit; where MPS is installed the agent holds GPU
# shares with it (gpuSharing: mps), and section 3 adds three 0.5 pods: two that allocate 0.4
# then 0.6 of the GPU's memory (the first fits, the second must fail), and one that first raises
# its own CUDA_MPS_* limits (it must fail the same). Each section prints what it ran and got
# and goes on whatever failed; the whole report goes to stdout and to $OUT/gpu_check.txt
# (OUT default /tmp/out), the daemons' logs to $OUT/gpu_check_logs/.
#
# It changes no GPU setting (no nvidia-smi -c, MIG, clocks or reset). Everything it starts it
# stops (the MPS daemon with `quit`, the server and agent, the probes), and the accounts it
# makes it removes, on every exit (trap). The probes are in bench/gpu_check.py (copied to a
# temporary directory every account may read). Work stops starting new steps once
# GPU_CHECK_BUDGET_S (default 210) seconds have passed; each step has its own timeout.

set -o pipefail
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-210}
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
PODUSER="arrpod$TAG"
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
ARR=()
POD_AS="(no agent)"

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
  hdr "2. arranger server + one root agent on 127.0.0.1"
  if command -v arranger >/dev/null; then
    ARR=(arranger)
  elif "$PY" -c 'import arranger' 2>/dev/null; then
    ARR=("$PY" -c 'import sys; from arranger.client.cli import main; sys.exit(main())')
  else
    echo "FAILED: neither \`arranger\` on PATH nor arranger importable by $PY (PYTHONPATH=${PYTHONPATH:-})"
    return 1
  fi
  echo "arranger: ${ARR[*]} ($("${ARR[@]}" --version 2>&1 | head -1))"
  PORT=$(free_port) || { echo "FAILED: no free port"; return 1; }
  mkdir -p "$TOP/server" "$TOP/agent"
  run 30 "${ARR[@]}" server --insecure --init --data-dir "$TOP/server" || return 1
  timeout -k 5 600 "${ARR[@]}" server --insecure --listen "127.0.0.1:$PORT" --http-listen "" \
    --data-dir "$TOP/server" --log-level info >"$TOP/server.log" 2>&1 &
  SERVER_PID=$!
  echo "server pid $SERVER_PID on 127.0.0.1:$PORT"
  printf 'podman: false\nusageIntervalSeconds: 2\n' >"$TOP/agent.yaml"
  if command -v nvidia-cuda-mps-control >/dev/null && [ -z "${GPU_CHECK_FAKE_GPUS:-}" ]; then
    echo "gpuSharing: mps" >>"$TOP/agent.yaml" # each 0.5 pod of section 3 gets its own daemon
  fi
  local extra=(--user "$PODUSER")
  if ! make_user "$PODUSER"; then
    echo "no account for the pods: they run as root (--run-as-root) instead"
    extra=(--run-as-root)
  elif ! command -v setpriv >/dev/null; then
    echo "no setpriv: the agent cannot switch users; pods run as root (--run-as-root) instead"
    extra=(--run-as-root)
  elif ! user_python "$PODUSER"; then
    echo "$PODUSER cannot run $POD_PY with torch: pods run as root (--run-as-root) instead"
    echo "(the device filter holds root in the pod's cgroup too; root could leave the cgroup)"
    extra=(--run-as-root)
  fi
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
  for ((i = 0; i < 50; i++)); do
    "${ARR[@]}" --server "127.0.0.1:$PORT" nodes >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.3
  done
  timeout -k 5 600 "${ARR[@]}" agent --config "$TOP/agent.yaml" --server "127.0.0.1:$PORT" \
    --node-name gpu-check --address 127.0.0.1 --data-dir "$TOP/agent" --stop-pods \
    --log-level debug "${extra[@]}" >"$TOP/agent.log" 2>&1 &
  AGENT_PID=$!
  echo "agent pid $AGENT_PID: ${extra[*]}"
  POD_AS=$PODUSER
  [[ " ${extra[*]} " == *" --run-as-root "* ]] && POD_AS=root
  ARR+=(--server "127.0.0.1:$PORT")
  local ready=""
  for ((i = 0; i < 100; i++)); do
    if "${ARR[@]}" nodes 2>/dev/null | grep -q 'gpu-check.*Ready'; then ready=1; break; fi
    kill -0 "$AGENT_PID" 2>/dev/null || break
    sleep 0.4
  done
  [ -n "$ready" ] && echo "agent registered after $(elapsed)s" || echo "FAILED: the agent did not register (see its log below)"
  run 20 "${ARR[@]}" nodes
  echo "\$ ${ARR[*]} nodes -o json"
  timeout 20 "${ARR[@]}" nodes -o json >"$TOP/nodes.json" 2>&1
  cat "$TOP/nodes.json"
  NODE_GPUS=$("$PY" -c '
import json, sys
try:
    nodes = json.load(open(sys.argv[1]))
    print(sum(len(n.get("gpus", [])) for n in nodes))
except Exception:
    print(0)' "$TOP/nodes.json")
  echo "GPUs the node reports: $NODE_GPUS"
  note "2. node: $NODE_GPUS GPU(s), pods as $POD_AS; $("${ARR[@]}" nodes 2>&1 | grep gpu-check | tr -s ' ' | cut -c1-200)"
  note "2. gpuSharing: $(tr -d '\n' <"$TOP/nodes.json" | tr -s ' ' | grep -o '"gpuSharing": {[^}]*}')"
  sub "agent log (cgroups, device filter, GPUs; debug level)"
  sed 's/^/   | /' "$TOP/agent.log" | head -80
  sub "server log (head)"
  sed 's/^/   | /' "$TOP/server.log" | head -20
  sub "cgroup directories the agent made"
  sh_run 5 'find /sys/fs/cgroup -maxdepth 4 -type d -path "*arranger/gpu-check*" 2>/dev/null | head -20'
  [ -n "$ready" ]
}

# ---------------------------------------------------------------- 3. isolation via arranger jobs

job_yaml() { # job_yaml NAME MODE RESOURCES
  cat <<EOF
apiVersion: arranger/v1
kind: TYJob
metadata:
  name: $1
spec:
  restartLimit: 0
  leader:
    name: probe
    template:
      command: [$POD_PY, $PROBE, pod, $2]
      resources: $3
EOF
}

# unfinished NAME...: how many of the jobs have not Succeeded or Failed (one `list` call).
unfinished() {
  "${ARR[@]}" list -o json 2>/dev/null | "$PY" -c '
import json, sys
try:
    jobs = {j["name"]: j.get("progress", {}).get("stage", "") for j in json.load(sys.stdin)}
except Exception:
    jobs = {}
print(sum(jobs.get(name) not in ("Succeeded", "Failed") for name in sys.argv[1:]))' "$@"
}

job_stage() {
  "${ARR[@]}" get "$1" -o json 2>/dev/null | "$PY" -c '
import json, sys
try:
    job = json.load(sys.stdin)
    status = job.get("status", {})
    print(status.get("stage", "?"), status.get("reason", ""), "|", status.get("message", ""))
except Exception as exc:
    print("?", exc)'
}

section_isolation() {
  hdr "3. isolation of pods on the real GPU (pods run as $POD_AS)"
  [ -n "$AGENT_PID" ] || { echo "SKIPPED: no agent (section 2 failed)"; return 1; }
  local jobs=(gpucheck-nogpu gpucheck-pids)
  job_yaml gpucheck-nogpu nogpu '{cpu: 1, memory: 16Gi}' >"$TOP/nogpu.yaml"
  job_yaml gpucheck-pids pids '{cpu: 1, memory: 1Gi, pids: 64}' >"$TOP/pids.yaml"
  if [ "$NODE_GPUS" -gt 0 ]; then
    job_yaml gpucheck-gpu gpu '{cpu: 1, memory: 16Gi, gpu: 1}' >"$TOP/gpu.yaml"
    jobs=(gpucheck-gpu "${jobs[@]}")
    if tr -d '\n' <"$TOP/nodes.json" | grep -q '"gpuSharing": {[^}]*"enforced": true'; then
      local s
      for s in share1:share share2:share shareraised:share-raised; do
        job_yaml "gpucheck-${s%%:*}" "${s#*:}" '{cpu: 1, memory: 8Gi, gpu: 0.5}' >"$TOP/${s%%:*}.yaml"
        jobs+=("gpucheck-${s%%:*}")
      done
    else
      echo "the node does not enforce GPU shares (no MPS here?): no 0.5 pods submitted"
    fi
  else
    echo "the node reports no GPU: the one-GPU job is not submitted (it could never be placed)"
  fi
  local j
  for j in "${jobs[@]}"; do
    sub "submit $j"
    sed 's/^/   | /' "$TOP/${j#gpucheck-}.yaml"
    run 20 "${ARR[@]}" submit "$TOP/${j#gpucheck-}.yaml"
  done
  local deadline=$(($(date +%s) + $(cap 120))) pending shown=""
  while :; do
    pending=$(unfinished "${jobs[@]}")
    if [ -z "$shown" ] && "${ARR[@]}" list 2>/dev/null | grep -q Running; then
      shown=1
      sub "while a pod runs"
      run 10 "${ARR[@]}" list
      run 15 "${ARR[@]}" top --once # per-pod CPU, memory and GPU use as the agent samples it
      sh_run 5 'find /sys/fs/cgroup -path "*arranger/gpu-check/*" -name cgroup.procs 2>/dev/null | head -12'
      command -v bpftool >/dev/null && sh_run 10 'bpftool cgroup tree /sys/fs/cgroup 2>&1 | grep -B1 -A3 -i arranger | head -30'
      echo "MPS processes (the agent's daemons for 0.5 pods): $(mps_procs | tr '\n' ';')"
    fi
    [ "$pending" -eq 0 ] && break
    [ "$(date +%s)" -ge "$deadline" ] && { echo "DEADLINE: $pending job(s) not finished"; break; }
    sleep 1
  done
  for j in "${jobs[@]}"; do
    sub "job $j: $(job_stage "$j")"
    run 15 "${ARR[@]}" get "$j"
    run 15 "${ARR[@]}" logs "$j" | sed 's/^/   | /'
  done
  sub "expected: gpu opens /dev/nvidia0 and runs the matmul; nogpu gets EPERM on every NVIDIA node and no CUDA; pids forks fewer than 64"
  echo "expected of share1, share2, shareraised (0.5 each, where submitted): alloc_0.4 ok, alloc_0.6 an out-of-memory error, greedy_gib near half the card; matmuls_per_s against gpu's (the whole card): the cost of a share while two run"
  local line
  for j in "${jobs[@]}"; do
    line="$j: $(job_stage "$j" | cut -c1-120) $("${ARR[@]}" logs "$j" 2>/dev/null | grep '^RESULT ' | tail -1)"
    echo "$line"
    note "3. $line"
  done
  sub "agent log since the jobs (warnings, errors, pod lines)"
  grep -Ein 'warn|error|gpu|device|cgroup|pids' "$TOP/agent.log" | tail -30 | sed 's/^/   | /'
  sub "stopping the agent (it stops its pods) and the server"
  stop_arranger
  echo "MPS processes after the agent stopped its pods (expected: none of its daemons): $(mps_procs | tr '\n' ';')"
  kill_user_procs "$PODUSER"
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

section_facts || echo "section 1 ended with a failure (continuing)"
if [ -z "$PY" ]; then
  echo "no python3 on PATH: sections 2-4 need it"
else
  section_arranger || echo "section 2 ended with a failure (continuing)"
  section_isolation || echo "section 3 ended with a failure (continuing)"
  if [ -n "$HAVE_SMI" ]; then
    section_mps || echo "section 4 ended with a failure (continuing)"
  else
    hdr "4. MPS across owners"
    echo "SKIPPED: no nvidia-smi, so no NVIDIA driver here"
  fi
fi
exit 0
