#!/usr/bin/env bash
# The CPU replica end to end (README, "The paper's matrix"): writes the probe-format training documents,
# trains ablations/cpu_replica.yaml on this machine two cells at a time (about 1 h 30 min on 2 cores; run
# again, it resumes), then tests each run's retrieval heads by ablation at the training length: the 2 best
# heads (chosen on held-out probes) against 20 layer-matched random draws, and every head alone (one run
# per core, about 5 minutes in all), and writes the report with the verdicts on the paper's findings to
# analysis/results/cpu_replica/. A run whose top 2 is tied (e.g. no head scores at all) has no top-2
# ablation (the refusal is in its heads_ablation.log), only the single-head one.
set -euo pipefail
cd "$(dirname "$0")/.."
hl=${HYBRID_LIGHTNING:-$( [ -x .venv/bin/hybrid-lightning ] && echo .venv/bin/hybrid-lightning || echo hybrid-lightning )}
root=runs/cpu_replica
$hl probes passkey niah_single_1 --lengths 511 --samples 5000 --value-tokens 16 --seed 1 --out "$root/probes.jsonl"
$hl grid submit ablations/cpu_replica.yaml --executor local --parallel 2

ablate() {  # run directory
    if ! $hl heads "$1" --mask-top 2 --controls 20 --mask-each --set 'eval.lengths=[512]'; then
        echo "no top-2 ablation for $1 (the refusal above); every head alone:"
        $hl heads "$1" --mask-each --set 'eval.lengths=[512]'
    fi
}
runs=("$root"/arch=*/)
for ((i = 0; i < ${#runs[@]}; i += 2)); do  # one run per core
    pids=()
    for run in "${runs[@]:i:2}"; do
        OMP_NUM_THREADS=1 ablate "$run" > "$run/heads_ablation.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
done
$hl analyze "$root" --grid ablations/cpu_replica.yaml --findings --out analysis/results/cpu_replica
