#!/usr/bin/env bash
# The before/after table of docs/results/2026-12-07-qwen2.5-0.5b-rl.md: the RL job of
# configs/qwen2.5-0.5b-search-rl.toml (trained on Cranfield, evaluated by the job on Cranfield's
# test split), then the same three policies — base, sft, tuned (the RL step validation chose) —
# and the scripted baselines on the held-out collections' test splits (Vaswani, MuSiQue-100),
# then scripts/qwen-rl-table.py over all three (which computes the paired intervals from the
# per-task scores of the separate reports).
#
#   scripts/qwen-rl-table.sh      # needs: scripts/fetch-qwen.sh, scripts/fetch-embedder.sh,
#                                 # mtrl data prepare --config configs/{vaswani,musique}.toml
# Env: MTRL (the binary, default target/release/mtrl). The job resumes if it was stopped; an
# evaluation whose eval.json exists is kept. Writes runs/qwen-rl/table/.
set -euo pipefail
cd "$(dirname "$0")/.."
mtrl="${MTRL:-target/release/mtrl}"
model=models/qwen2.5-coder-0.5b-instruct/model.gguf
job=configs/qwen2.5-0.5b-search-rl.toml
out=runs/qwen-rl/table
[ -f runs/qwen-rl/rl/eval/eval.json ] || "$mtrl" train --config "$job"
mkdir -p "$out/cranfield"
cp runs/qwen-rl/rl/eval/eval.json "$out/cranfield/eval.json"
tuned="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' runs/qwen-rl/rl/best.json)"
tuned="runs/qwen-rl/rl/step-$(printf %08d "$tuned")/policy"
for c in vaswani musique; do
  cfg=configs/qwen2.5-0.5b-search-rl-$c.toml
  if [ ! -f "$out/$c/base/eval.json" ]; then
    "$mtrl" eval --config "$cfg" --model "$model" --k 0 \
      --policy bm25-once --policy vector-once --policy hybrid-rrf --out "$out/$c/base" --quiet
  fi
  if [ ! -f "$out/$c/sft/eval.json" ]; then
    "$mtrl" eval --config "$cfg" --model "$model" --adapter runs/qwen-rl/sft --k 0 \
      --out "$out/$c/sft" --quiet
  fi
  if [ ! -f "$out/$c/tuned/eval.json" ]; then
    "$mtrl" eval --config "$cfg" --model "$model" --adapter "$tuned" --k 0 \
      --out "$out/$c/tuned" --quiet
  fi
done
python3 scripts/qwen-rl-table.py "$out"
