#!/usr/bin/env bash
# A SLURM cluster on this machine, of one node or several, for tests and for trying grids without a cluster.
#
#   slurm/local-cluster.sh up [--nodes N] [DIR]
#                                      install slurm-wlm + munge if missing (apt, needs root), start
#                                      munged, slurmctld and N slurmd (default 1) under DIR (default:
#                                      a new temp folder) and wait until every node is idle; prints
#                                      the line `export SLURM_CONF=DIR/slurm.conf` for clients and submitit
#   slurm/local-cluster.sh down DIR    cancel its jobs, stop those daemons and delete DIR
#
# Everything lives under DIR: config, munge key and socket, spool, state, logs; ports are picked
# free, so several clusters can run side by side, and nothing of the machine's own configuration
# (/etc, the hosts file, a system munged or slurmd) is changed. One partition `debug`. Each node
# has this machine's CPUs (or LOCAL_CLUSTER_CPUS of them, to run more jobs at once than there are
# cores), its share of the memory, and two fake GPUs (GRES gpu:2 backed by /dev/null-like character
# devices): a job asking for GPUs sees CUDA_VISIBLE_DEVICES set, though no GPU exists.
#
# One node is `localhost`. N > 1 nodes are n1 ... nN: N slurmd on this host, each with its own
# port (Port= on its NodeName line) and its own spool, pid and log files (%n in their paths), all
# reached at NodeHostname=localhost NodeAddr=127.0.0.1. The names n1 ... nN resolve nowhere:
# SLURM reaches the nodes by NodeAddr, and a job's rendezvous address is the first node's NodeAddr
# (hybrid-lightning sets MASTER_ADDR from it, training/cluster.py); a program of your own run on
# them needs MASTER_ADDR=127.0.0.1.
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

# The node names of a cluster of $1 nodes, one a line.
node_names() { if [ "$1" = 1 ]; then echo localhost; else seq -f 'n%g' 1 "$1"; fi; }

# slurm.conf's hardware fields for one node (CPUs, sockets, cores, memory): this machine's as slurmd
# sees it, or LOCAL_CLUSTER_CPUS CPUs; memory is a little below the total, shared among $1 nodes.
node_hardware() {
  local nodes=$1 hw mem
  hw=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//')
  [ -n "${LOCAL_CLUSTER_CPUS:-}" ] && hw="CPUs=$LOCAL_CLUSTER_CPUS"
  mem=$(( $(slurmd -C | head -1 | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 9 / 10 / nodes ))
  echo "$hw RealMemory=$mem"
}

write_config() {
  local dir=$1 nodes=$2 hw name overrides=""
  hw=$(node_hardware "$nodes")
  # slurmd takes the declared CPUs over the real ones
  [ -n "${LOCAL_CLUSTER_CPUS:-}" ] && overrides="SlurmdParameters=config_overrides"
  cat > "$dir/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=10: a requeued job may start again after 10 s instead of about two minutes.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
# %n: each slurmd of this host (one per node) has its own spool, pid file and log.
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
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
EOF
  echo "AutoDetect=off" > "$dir/gres.conf"
  for name in $(node_names "$nodes"); do
    mkdir -p "$dir/spool/$name" "$dir/gpu/$name"
    # Two fake GPUs per node: character devices with /dev/null's numbers.
    for i in 0 1; do [ -e "$dir/gpu/$name/nvidia$i" ] || mknod "$dir/gpu/$name/nvidia$i" c 1 3; done
    echo "NodeName=$name NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(free_port) $hw Gres=gpu:2 State=UNKNOWN" >> "$dir/slurm.conf"
    echo "NodeName=$name Name=gpu File=$dir/gpu/$name/nvidia[0-1]" >> "$dir/gres.conf"
  done
  echo "PartitionName=debug Nodes=$(node_names "$nodes" | paste -sd,) Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
}

# Waits until every node is idle (or already running jobs); fails with the logs' tails otherwise.
wait_idle() {
  local dir=$1 nodes=$2 states=""
  for _ in $(seq 120); do
    states=$(sinfo -h -N -o %t 2>/dev/null | sort | uniq | paste -sd' ' || true)
    if [ "$(sinfo -h -N -t idle,mix,alloc -o %N 2>/dev/null | wc -l)" = "$nodes" ]; then return 0; fi
    sleep 0.5
  done
  tail -n 5 "$dir"/log/*.log >&2 || true
  die "not every node became idle (states '${states:-none}'); logs in $dir/log"
}

up() {
  local nodes=1 dir=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes=${2:-}; shift 2 || die "--nodes needs a number" ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      -*) die "unknown option $1 (usage: $0 up [--nodes N] [DIR])" ;;
      *) [ -z "$dir" ] || die "one DIR only (usage: $0 up [--nodes N] [DIR])"; dir=$1; shift ;;
    esac
  done
  [[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a whole number >= 1, got '$nodes'"
  [ "$(id -u)" = 0 ] || die "the local cluster runs its daemons as root; run it as root"
  install_if_missing
  dir=${dir:-$(mktemp -d /tmp/slurm-local.XXXXXX)}
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

  write_config "$dir" "$nodes"
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" || die "slurmctld did not start (see $dir/log/slurmctld.log)"
  local name
  for name in $(node_names "$nodes"); do
    slurmd -f "$SLURM_CONF" -N "$name" || die "slurmd -N $name did not start (see $dir/log/slurmd-$name.log)"
  done
  wait_idle "$dir" "$nodes"
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
  local dir=$1 pidfile
  # Jobs still running are cancelled first, so no training process outlives the cluster.
  [ -f "$dir/slurmctld.pid" ] && SLURM_CONF="$dir/slurm.conf" timeout 30 scancel --quiet --full --user="$(id -un)" 2>/dev/null
  for pidfile in "$dir"/slurmd-*.pid; do stop_pidfile "$pidfile"; done
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
  up) shift; up "$@" ;;
  down) down "${2:-}" ;;
  *) echo "usage: $0 up [--nodes N] [DIR] | down DIR" >&2; exit 2 ;;
esac
