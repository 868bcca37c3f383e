#!/usr/bin/env bash
# Trains ablations/retrieval_heads.yaml on probe-format data and tests its retrieval heads by ablation:
# the 2 best heads masked against 2 random heads (seeds 0, 1, 2). Results: runs/retrieval-heads/run/eval/.
set -euo pipefail
cd "$(dirname "$0")/.."
hl=${HYBRID_LIGHTNING:-$( [ -x .venv/bin/hybrid-lightning ] && echo .venv/bin/hybrid-lightning || echo hybrid-lightning )}
$hl probes passkey niah_single_1 --lengths 512 --samples 2000 --value-tokens 16 --seed 1 --out runs/retrieval-heads/probes.jsonl
$hl train ablations/retrieval_heads.yaml --run-dir runs/retrieval-heads/run
$hl heads runs/retrieval-heads/run --mask-top 2
for seed in 0 1 2; do
    $hl heads runs/retrieval-heads/run --mask-random 2 --seed "$seed"
done
