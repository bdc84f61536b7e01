#!/usr/bin/env bash
# The learner's stall per checkpoint, synchronous vs background writer (`mtrl bench checkpoint`),
# on a random 27 M-parameter Qwen3 (hidden 512, 8 layers; ~300 MB checkpoints with the optimizer
# state) over the one-token `pick` task: 8 steps, a checkpoint every 2 (`--every 1` for every
# step). Usage: scripts/bench-checkpoint-stall.sh [path/to/mtrl] [extra `bench checkpoint` flags]
# (default binary: a release build, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mtrl=${1:-target/release/mtrl}
shift || true
[ -x "$mtrl" ] || cargo build --release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$root" "$work" <<'PY'
import json, sys
root, work = sys.argv[1], sys.argv[2]
c = json.load(open(f"{root}/tests/fixtures/tiny-qwen3/config.json"))
c.update(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
         num_key_value_heads=4, head_dim=64, layer_types=["full_attention"] * 8)
json.dump(c, open(f"{work}/model.json", "w"))
open(f"{work}/stall.toml", "w").write(f'''name = "stall"
[model]
path = "random:{work}/model.json"
tokenizer = "{root}/tests/fixtures/tiny-qwen3"
[data]
train = "{root}/tests/fixtures/pick/tasks.jsonl"
validation_fraction = 0.0
[rollout]
environment = "pick"
group_size = 4
rollout_max_concurrency = 4
top_k = 16
[algorithm]
max_staleness = 0
[train]
global_batch_size = 2
max_epochs = 8
lr = 0.001
[checkpoint]
dir = "{work}/run"
''')
PY
"$mtrl" bench checkpoint --config "$work/stall.toml" "$@"
