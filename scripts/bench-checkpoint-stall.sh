#!/usr/bin/env bash
# Learner stall per checkpoint, synchronous vs background writer ([checkpoint] background).
# A random 27 M-parameter Qwen3 (hidden 512, 8 layers) on the one-token `pick` task, 8 steps with a
# checkpoint every 2 (~300 MB with the optimizer state); prints one JSON object per mode with the
# `time_checkpoint_s` of the steps after a checkpoint (learner seconds spent on it: copying the
# tensors, plus waiting for the previous save if it has not finished) and the run's wall time. Usage: scripts/bench-checkpoint-stall.sh [path/to/mtrl] (default: a
# release build, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mtrl=${1:-target/release/mtrl}
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
for bg in ("true", "false"):
    open(f"{work}/{bg}.toml", "w").write(f'''name = "stall-{bg}"
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
max_steps = 8
lr = 0.001
[checkpoint]
dir = "{work}/run-{bg}"
every_steps = 2
keep_last = 1
background = {bg}
''')
PY
for bg in true false; do
  t0=$(date +%s.%N)
  "$mtrl" train --quiet --config "$work/$bg.toml" > /dev/null
  t1=$(date +%s.%N)
  python3 - "$work/run-$bg/metrics.jsonl" "$bg" "$t0" "$t1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
stall = [r["time_checkpoint_s"] for r in rows if r["step"] % 2 == 1 and r["step"] > 1]
print(json.dumps({"background": sys.argv[2] == "true",
                  "checkpoint_stall_s": [round(s, 3) for s in stall],
                  "mean_stall_s": round(sum(stall) / len(stall), 3),
                  "run_wall_s": round(float(sys.argv[4]) - float(sys.argv[3]), 2)}))
PY
done
