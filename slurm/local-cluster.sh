#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for tests and for trying grids without a cluster.
#
#   slurm/local-cluster.sh up [DIR]    install slurm-wlm + munge if missing (apt, needs root), start
#                                      munged, slurmctld and slurmd under DIR (default: a new temp
#                                      folder) and wait until the node is idle; prints the line
#                                      `export SLURM_CONF=DIR/slurm.conf` for clients and submitit
#   slurm/local-cluster.sh down DIR    stop those daemons and delete DIR
#
# Everything lives under DIR: config, munge key and socket, spool, state, logs; ports are picked
# free, so several clusters can run side by side. The node is `localhost` with this machine's CPUs
# (or LOCAL_CLUSTER_CPUS of them, to run more jobs at once than there are cores) and memory, one
# partition `debug`, and two fake GPUs (GRES gpu:2 backed by /dev/null-like character devices):
# a job asking for GPUs sees CUDA_VISIBLE_DEVICES set, though no GPU exists.
set -euo pipefail

die() { echo "local-cluster: $*" >&2; exit 1; }

install_if_missing() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
  [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are not installed and installing them needs root"
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get"
  echo "local-cluster: installing slurm-wlm and munge" >&2
  # `timeout`: a mirror that does not answer must fail the start, not hang it.
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq slurm-wlm munge >&2 \
    || die "apt-get install slurm-wlm munge failed"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

up() {
  [ "$(id -u)" = 0 ] || die "the local cluster runs its daemons as root; run it as root"
  install_if_missing
  local dir=${1:-$(mktemp -d /tmp/slurm-local.XXXXXX)}
  mkdir -p "$dir"/{munge,spool,state,log,gpu}
  dir=$(cd "$dir" && pwd)
  chmod 700 "$dir" "$dir/munge"
  # On any failure below, the daemons started so far are stopped; DIR stays for its logs.
  trap "stop_daemons '$dir'" EXIT

  # munge: our own key, socket, pid and log, so a system munged (if any) is left alone.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
    || die "munged did not start (see $dir/munge/munged.log)"

  # Two fake GPUs: character devices with /dev/null's numbers.
  for i in 0 1; do [ -e "$dir/gpu/nvidia$i" ] || mknod "$dir/gpu/nvidia$i" c 1 3; done

  # The node as slurmd sees it (CPUs, sockets, cores, memory), renamed localhost: the machine's
  # hostname need not resolve. Memory is declared a little below the total so slurmd accepts it.
  local hw mem overrides=""
  hw=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//')
  if [ -n "${LOCAL_CLUSTER_CPUS:-}" ]; then
    hw="CPUs=$LOCAL_CLUSTER_CPUS"
    overrides="SlurmdParameters=config_overrides"  # slurmd takes the declared CPUs over the real ones
  fi
  mem=$(( $(slurmd -C | head -1 | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 9 / 10 ))
  cat > "$dir/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=10: a requeued job may start again after 10 s instead of about two minutes.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default memory per CPU, one job would take the whole node's memory.
DefMemPerCPU=1000
ReturnToService=2
SchedulerParameters=sched_interval=2
# Jobs are killed 5 s after their SIGTERM (default 30 s): tests of time limits finish sooner.
KillWait=5
GresTypes=gpu
$overrides
NodeName=localhost NodeAddr=127.0.0.1 $hw RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$dir/gres.conf" <<EOF
AutoDetect=off
NodeName=localhost Name=gpu File=$dir/gpu/nvidia[0-1]
EOF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" || die "slurmctld did not start (see $dir/log/slurmctld.log)"
  slurmd -f "$SLURM_CONF" -N localhost || die "slurmd did not start (see $dir/log/slurmd.log)"

  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -N -n localhost -o %t 2>/dev/null || true)
    case "$state" in idle|mix|alloc) break ;; esac
    sleep 0.5
  done
  case "$state" in
    idle|mix|alloc) ;;
    *) tail -n 5 "$dir"/log/*.log >&2 || true
       die "the node did not become idle (state '${state:-none}'); logs in $dir/log" ;;
  esac
  trap - EXIT
  echo "export SLURM_CONF=$SLURM_CONF"
}

stop_pidfile() {
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

stop_daemons() {
  local dir=$1
  # Jobs still running are cancelled first, so no training process outlives the cluster.
  [ -f "$dir/slurmctld.pid" ] && SLURM_CONF="$dir/slurm.conf" timeout 30 scancel --quiet --full --user="$(id -un)" 2>/dev/null
  stop_pidfile "$dir/slurmd.pid"
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/munge/munged.pid"
}

down() {
  local dir=${1:?usage: $0 down DIR}
  [ -f "$dir/slurm.conf" ] || die "$dir is not a local cluster folder (no slurm.conf)"
  stop_daemons "$dir"
  rm -rf "$dir"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down "${2:-}" ;;
  *) echo "usage: $0 up [DIR] | down DIR" >&2; exit 2 ;;
esac
