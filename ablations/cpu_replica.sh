#!/usr/bin/env bash
# The CPU replica end to end (docs/grids.md, "A CPU replica"): `ablations/cpu_replica.sh [GRID] [--train-only]`,
# GRID ablations/cpu_replica.yaml by default; --train-only leaves out the head ablation and the diagnostics (a
# scaling grid, measured at its runs' ends).
# It spans sittings whose runs/ do not survive: the finished runs are kept as packed records in
# analysis/results/<grid name>/runs/ (hybrid-lightning pack, docs/run-directory.md), which this script
# copies back into the grid's root first, so the grid trains only the cells not packed yet. Each run is
# ablated, diagnosed and packed as soon as it is done, beside the training, so a sitting cut short keeps every
# run that finished. Run it again in the next sitting (after committing the packed runs); stopped with SIGTERM
# (or Ctrl-C) to it or to its `grid submit`, it keeps what finished and analyses it.
#
# Steps: write the training data (probe-format documents with probe seed 1; natural text from the
# standard library's source, some files held out for val/text_loss); train the remaining cells two at
# a time; ablate the retrieval heads of every run trained in this sitting at the training length (the
# 2 best heads against 20 random pairs of non-retrieval heads from their own layers, none where the pair
# fills its layer, and 20 from any layer, and every head alone; only the latter where the top 2 is
# tied); run the paper's diagnostics on them (docs/evaluation.md: the probes within the training length
# with the full or the efficient layers restricted to 64 tokens, an eighth of it as the paper's 2K of 16K;
# layer probes, brief, within the training length; gradient influence; the top 4 heads by attention mass of the
# final checkpoint traced back over the kept checkpoints, on 100 needle prompts within the training length); pack
# the finished runs; analyse
# the packed runs into analysis/results/<grid name>/.
# Before training more: `hybrid-lightning grid plan GRID --verdicts` says which
# verdicts these arms and seeds can reach (docs/analysis.md, "The design check").
set -euo pipefail
cd "$(dirname "$0")/.."
hl=${HYBRID_LIGHTNING:-$( [ -x .venv/bin/hybrid-lightning ] && echo .venv/bin/hybrid-lightning || echo hybrid-lightning )}
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
grid=${1:-ablations/cpu_replica.yaml}
train_only=0
case "${2:-}" in
    "") ;;
    --train-only) train_only=1 ;;
    *) echo "usage: ablations/cpu_replica.sh [GRID] [--train-only], not '$2'" >&2; exit 2 ;;
esac
name=$(basename "$grid" .yaml)
data=runs/cpu_replica  # the training data of every edition (the grids name these files)
root=runs/$name
results=analysis/results/$name
mkdir -p "$data" "$root"

[ -f "$data/probes.jsonl" ] || $hl probes passkey niah_single_1 --lengths 511 --samples 5000 --value-tokens 16 --seed 1 \
    --out "$data/probes.jsonl"
[ -f "$data/trace_niah.jsonl" ] || {  # the tracing's prompts, in RULER's rows: probe seed 5, apart from training's 1
    $hl probes niah_single_1 --lengths 511 --samples 100 --value-tokens 16 --seed 5 --out "$data/trace_probes.jsonl"
    "$py" -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
out = "".join(json.dumps({"input": r["text"][: -len(r["answer"])], "outputs": [r["answer"].strip()]}) + "\n" for r in rows)
open(sys.argv[2] + ".tmp", "w").write(out)' "$data/trace_probes.jsonl" "$data/trace_niah.jsonl"
    mv "$data/trace_niah.jsonl.tmp" "$data/trace_niah.jsonl"
}
[ -f "$data/text_val.jsonl" ] || "$py" - "$data" <<'PY'
# Natural text: the standard library's source files (the embedded corpus) in their fixed order, one
# document each; a file whose path hashes to 0 mod 20 is held out. 2.5M bytes (= tokens) for training.
import hashlib, json, sys
from pathlib import Path
from hybrid_lightning.data.corpus import embedded_files

root, budget = Path(sys.argv[1]), {"text": 2_500_000, "text_val": 250_000}
out = {name: [] for name in budget}
for path in embedded_files():
    name = "text_val" if int(hashlib.sha256(path.name.encode()).hexdigest(), 16) % 20 == 0 else "text"
    text = path.read_text(encoding="utf-8", errors="replace")
    if sum(map(len, out[name])) + len(text) <= budget[name]:
        out[name].append(text)
for name, docs in out.items():
    if (root / f"{name}.jsonl").exists():  # written before, or someone's own: kept
        continue
    tmp = root / f"{name}.jsonl.tmp"
    tmp.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tmp.rename(root / f"{name}.jsonl")
    print(f"{root / name}.jsonl: {len(docs)} documents, {sum(map(len, docs)):,} characters")
PY

[ -d "$results/runs" ] && $hl unpack "$results/runs" --into "$root"

ablate() {  # run directory
    if ! $hl heads "$1" --mask-top 2 --controls 20 --mask-each --set 'eval.lengths=[512]'; then
        echo "no top-2 ablation for $1 (the refusal above); every head alone:"
        $hl heads "$1" --mask-each --set 'eval.lengths=[512]'
    fi
}
diagnose() {  # run directory; a restriction with nothing to limit (efficient layers of full attention) is left out
    $hl restrict "$1" --limit full:64 efficient:64 --set 'eval.lengths=[512]'
    $hl probe-layers "$1" --samples 400 --length 512 --brief && $hl gradient "$1" --samples 16 \
        && $hl trace "$1" --niah "$data/trace_niah.jsonl" --max-samples 100
}
pack_one() {  # run directory: its packed record, at its path under the grid's root
    $hl pack "$1" --out "$results/runs/${1#"$root"/}"
}
step() {  # run directory, log name, function: its output kept in <run>/<name>.log once it succeeded; done once
    [ -f "$1/$2.log" ] || { OMP_NUM_THREADS=1 "$3" "$1" > "$1/$2.log.tmp" 2>&1 && mv "$1/$2.log.tmp" "$1/$2.log"; }
}
finish() {  # run directory: ablated and diagnosed (not with --train-only), then packed
    local ok=0
    if [ "$train_only" = 0 ]; then
        step "$1" heads_ablation ablate || ok=1
        step "$1" diagnostics diagnose || ok=1
    fi
    [ "$ok" = 1 ] || step "$1" packed pack_one || ok=1
    [ "$ok" = 0 ] || echo "$1: not finished (see its *.log.tmp); packed as it is at the end" >&2
    return "$ok"
}
finished() {  # runs trained here (a checkpoint) and done, not yet finished
    local status
    find "$root" -name status.json -not -path '*/.grid/*' | sort | while IFS= read -r status; do
        local run=${status%/status.json}
        if [ -f "$run/checkpoints/last.ckpt" ] && grep -q '"state": "done"' "$status" && [ ! -f "$run/packed.log" ]; then
            echo "$run"
        fi
    done
}

code=0
# Each run is finished as soon as it is done, one at a time beside the training (a sitting cut short keeps every
# finished run in $results/runs); stopped or failed cells: what finished is kept.
$hl grid submit "$grid" --executor local --parallel 2 &
grid_pid=$!
trap 'kill -TERM "$grid_pid" 2> /dev/null || true' TERM INT  # this script stopped: its grid stopped, the rest kept
tried=" "
while kill -0 "$grid_pid" 2>/dev/null; do
    mapfile -t runs < <(finished)
    for run in "${runs[@]}"; do
        [[ "$tried" == *" $run "* ]] && continue  # one that did not finish is tried again at the end
        tried+="$run "
        finish "$run" || true
    done
    sleep 10 & wait $! || true  # a signal's trap runs at once
done
wait "$grid_pid" || code=$?
mapfile -t todo < <(finished)
for ((i = 0; i < ${#todo[@]}; i += 2)); do  # one run per core
    pids=()
    for run in "${todo[@]:i:2}"; do
        finish "$run" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || code=1; done
done
$hl pack "$root" --out "$results/runs"  # what did not finish too, as it is
if [ -d "$results/runs" ]; then  # at least one run finished
    $hl analyze "$results/runs" --grid "$grid" --findings --out "$results"
fi
exit "$code"
