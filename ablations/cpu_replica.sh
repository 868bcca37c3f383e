#!/usr/bin/env bash
# The CPU replica end to end (README, "The paper's matrix"): trains ablations/cpu_replica.yaml on this
# machine two cells at a time (about 2 hours on 2 cores; run again, it resumes), ablates the 2 best
# retrieval heads of every run and, as the control, 2 random ones, then writes the report with the
# verdicts on the paper's findings to analysis/results/cpu_replica/.
set -euo pipefail
cd "$(dirname "$0")/.."
hl=${HYBRID_LIGHTNING:-$( [ -x .venv/bin/hybrid-lightning ] && echo .venv/bin/hybrid-lightning || echo hybrid-lightning )}
root=${CPU_REPLICA_ROOT:-runs/cpu_replica}
$hl grid submit ablations/cpu_replica.yaml --executor local --parallel 2 --root "$root"
for run in "$root"/arch=*/; do
    $hl heads "$run" --mask-top 2
    $hl heads "$run" --mask-random 2 --seed 0
done
$hl analyze "$root" --grid ablations/cpu_replica.yaml --findings --out analysis/results/cpu_replica
