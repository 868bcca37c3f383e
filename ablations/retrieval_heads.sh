#!/usr/bin/env bash
# Trains ablations/retrieval_heads.yaml (both seeds, two at a time; run again, it resumes), then tests
# each run's retrieval heads by ablation on its evaluation probes: the K best heads masked against K
# random heads outside them (10 draws), for K = 2 and K = 4 (4: every head of the full-attention
# layer), and every attention head masked alone. The rows land in each run's
# eval/heads_step_<k>.json (the commands' printout in its heads_ablation.log); the report, with the
# ablation verdict, in analysis/results/retrieval_heads/.
set -euo pipefail
cd "$(dirname "$0")/.."
hl=${HYBRID_LIGHTNING:-$( [ -x .venv/bin/hybrid-lightning ] && echo .venv/bin/hybrid-lightning || echo hybrid-lightning )}
root=runs/retrieval-heads
$hl probes passkey niah_single_1 --lengths 511 --samples 5000 --value-tokens 16 --seed 1 --out "$root/probes.jsonl"
$hl grid submit ablations/retrieval_heads.yaml --executor local --parallel 2

ablate() {  # run directory
    for k in 2 4; do
        $hl heads "$1" --mask-top "$k"
        for seed in $(seq 0 9); do
            $hl heads "$1" --mask-random "$k" --seed "$seed"
        done
    done
    for layer in 0 1 2 3; do  # the model's 4 layers x 4 heads
        for head in 0 1 2 3; do
            $hl heads "$1" --mask "$layer.$head"
        done
    done
}
pids=()
for run in "$root"/seed=*/; do  # one run per core
    OMP_NUM_THREADS=1 ablate "$run" > "$run/heads_ablation.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
$hl analyze "$root" --grid ablations/retrieval_heads.yaml --findings --out analysis/results/retrieval_heads
