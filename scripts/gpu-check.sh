#!/usr/bin/env bash
# The GPU check, one command (default budget 450 s, under 8 minutes): on a machine with an NVIDIA
# GPU, a CUDA build of `mtrl` (no cargo needed there) and PyTorch + transformers, it runs
#   1. `mtrl selftest` on cuda:0 — the golden-fixture checks in f32 + a bf16 agreement check;
#   2. `mtrl bench model` with random weights of the real Qwen3-0.6B shape (bench/qwen3-0.6b.json),
#      bf16: prefill, decode at batch 1/16/64/256 (one process each, so a slow batch size loses
#      only its own figure), train step on [8, 2048] (fwd + bwd + AdamW) in one packed forward
#      with the fused attention (FlashAttention-2 when built with --features cuda,flash-attn),
#      and the spelled attention one row per forward beside it;
#   3. `mtrl train` for 5 RL steps (configs/gpu-train-smoke.toml): random Qwen3-0.6B-shaped
#      weights, bf16, the multi-turn search environment over Cranfield (BM25 + hashing-embedder
#      vectors), task files from `mtrl data prepare` and the Qwen3 tokenizer of tests/fixtures —
#      all carried by the repository; small group / batch / turns so it stays near a minute;
#      then `mtrl bench train --lora`: LoRA (rank 32) against full fine-tuning on the same shape,
#      one row of 2,048 tokens, with the phase's peak GPU memory;
#      and, after the engine bench, the learner with activation checkpointing: the [8, 2048]
#      step with all 8 rows in one forward, and one 16,384-token row;
#   4. `mtrl bench engine`: 64 four-call episodes (150-token tool responses) on the paged engine
#      and on the legacy one, side by side (episodes/s ratio, KV-reuse factor); then again with
#      the engine's attention gathered (`--attention gathered`: what the in-place kernels buy);
#   5. bench/torch_ref.py, the same workload with transformers (bf16 `generate` with KV cache;
#      forward + backward + AdamW, amp and pure bf16);
#   6. bench/gpu_report.py: one JSON line per figure, ratio lines and a summary.
# Peak GPU memory per phase: `nvidia-smi --query-gpu=memory.used` sampled every 200 ms beside
# each process, max minus the idle baseline (includes the CUDA context and allocator caches).
#
#   scripts/gpu-check.sh --dry-run [--bin PATH]     # here, without a GPU: build + argument checks
#   scripts/gpu-check.sh [--bin PATH] [--timeout S] [--device cuda:N] [--out DIR] [--python PY]
#   scripts/gpu-check.sh --cpu-smoke --bin PATH     # the whole pipeline on the CPU, tiny shapes
#
# PATH: the mtrl binary, or a gzip of it (`.gz`: how it travels, since a cuda build is over the
# device tool's 64 MiB); default target/gpu/mtrl, else target/gpu/mtrl.gz.
#
# Raw outputs go to --out (default: $OUT when set, else runs/gpu-check). Exit status: 0 when the
# selftest passed and every step ran (performance goals are reported, not enforced), else 1.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${MTRL_BIN:-}"
TIMEOUT=450
DEVICE="cuda:0"
OUTDIR="${OUT:-runs/gpu-check}"
PY="${PYTHON:-python3}"
FIXTURES="tests/fixtures"
SHAPE="bench/qwen3-0.6b.json"
DRY=0
SMOKE=0
BATCHES="1,16,64,256"
PROMPT=128
NEW=64
TRAIN_BATCH=8
TRAIN_LEN=2048
TRAIN_MICRO=1
LONG_LEN=16384
RL_CONFIG=configs/gpu-train-smoke.toml
ENGINE_WORKLOAD=(--episodes 64 --calls 4 --prompt-tokens 256 --tool-tokens 150 --new-tokens 32)
RL_STEPS=5

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "{\"check\":\"gpu-check\",\"ok\":false,\"error\":\"$*\"}"; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --cpu-smoke) SMOKE=1 ;;
    --bin) BIN="${2:?--bin needs a path}"; shift ;;
    --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift ;;
    --device) DEVICE="${2:?--device needs cuda:N}"; shift ;;
    --out) OUTDIR="${2:?--out needs a folder}"; shift ;;
    --python) PY="${2:?--python needs an interpreter}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
  shift
done
[[ "$TIMEOUT" =~ ^[0-9]+$ && "$TIMEOUT" -ge 60 ]] || die "--timeout must be an integer >= 60 (seconds)"
[[ "$DEVICE" =~ ^cuda(:[0-9]+)?$ ]] || die "--device must be cuda or cuda:N, not $DEVICE"
GPU_INDEX="${DEVICE#cuda}"; GPU_INDEX="${GPU_INDEX#:}"; GPU_INDEX="${GPU_INDEX:-0}"
TORCH_DEVICE="cuda:$GPU_INDEX"
if [[ "$SMOKE" == 1 ]]; then
  # Checks this script's plumbing on a CPU: same steps and report, tiny shapes, no GPU figures.
  DEVICE=cpu TORCH_DEVICE=cpu SHAPE=bench/bench-small.json BATCHES=1,2 PROMPT=8 NEW=4
  TRAIN_BATCH=2 TRAIN_LEN=32 TRAIN_MICRO=1 LONG_LEN=64
  RL_CONFIG=configs/cpu-train-smoke.toml RL_STEPS=2
  ENGINE_WORKLOAD=(--episodes 4 --calls 2 --prompt-tokens 16 --tool-tokens 8 --new-tokens 4)
fi
[[ -f "$SHAPE" ]] || die "missing $SHAPE"
for f in "$RL_CONFIG" configs/cranfield-hash.toml data/cranfield/docs.jsonl \
  "$FIXTURES/qwen3-tokenizer/tokenizer.json.gz" "$FIXTURES/qwen3-tokenizer/tokenizer_config.json"; do
  [[ -f "$f" ]] || die "missing $f (an input of the train smoke)"
done
for f in golden/tiny-qwen3/golden.safetensors golden/tiny-qwen3/golden.json tiny-qwen3/config.json; do
  [[ -f "$FIXTURES/$f" ]] || die "missing fixture $FIXTURES/$f"
done
if [[ -z "$BIN" ]]; then
  BIN=target/gpu/mtrl
  [[ -f "$BIN.gz" && ! -f "$BIN" ]] && BIN="$BIN.gz"
fi
[[ -f "$BIN" ]] || die "no mtrl binary at $BIN (build: see docs/gpu.md)"
# The device tool carries at most 64 MiB, and a cuda build is ~74 MiB: it travels gzip'd (~19 MB).
CARRIED="$BIN"
if [[ "$BIN" == *.gz ]]; then
  tmpd="$(mktemp -d)"
  trap 'rm -rf "$tmpd"' EXIT
  unpacked="$tmpd/mtrl"
  "$PY" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$BIN" "$unpacked" || die "cannot gunzip $BIN"
  chmod +x "$unpacked"
  BIN="$unpacked"
fi
[[ -x "$BIN" ]] || die "$BIN is not executable"

START=$(date +%s)
left() { echo $((TIMEOUT - ($(date +%s) - START))); }
# json k=v ...: one JSON line; values that parse as JSON (numbers, true/false) keep their type.
json() {
  "$PY" -c '
import json, sys
def val(v):
    try:
        return json.loads(v)
    except ValueError:
        return v
print(json.dumps({k: val(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}))' "$@"
}

# The commands, shared by the plan and the run.
SELFTEST=("$BIN" selftest --device "$DEVICE" --fixtures "$FIXTURES")
BENCH_COMMON=("$BIN" bench model --config "$SHAPE" --device "$DEVICE" --dtype bf16 --repeats 1)
BENCH_DECODE=("${BENCH_COMMON[@]}" --prompt-len "$PROMPT" --new-tokens "$NEW" --batch-sizes)
# The learner's headline: all [8, 2048] rows in one packed forward, attention fused where the binary
# carries FlashAttention-2 (--features cuda,flash-attn); beside it, in the same call, the spelled
# attention one row per forward (the recipe of the first GPU run: [8, 2048] spelled does not fit).
BENCH_TRAIN=("${BENCH_COMMON[@]}" --phases train --train-batch "$TRAIN_BATCH"
  --train-len "$TRAIN_LEN" --train-micro-batch 0 --attention auto)
BENCH_TRAIN_SPELLED=("${BENCH_COMMON[@]}" --phases train --train-batch "$TRAIN_BATCH"
  --train-len "$TRAIN_LEN" --train-micro-batch "$TRAIN_MICRO" --attention spelled)
# The learner with activation checkpointing: the whole [8, 2048] batch in one forward (the
# attention of one layer at a time), and one long row.
BENCH_TRAIN_CKPT=("${BENCH_COMMON[@]}" --phases train --train-batch "$TRAIN_BATCH"
  --train-len "$TRAIN_LEN" --train-micro-batch 0 --checkpointing)
BENCH_TRAIN_LONG=("${BENCH_COMMON[@]}" --phases train --train-batch 1 --train-len "$LONG_LEN"
  --checkpointing)
# LoRA (rank 32, all seven targets) against full fine-tuning on the same shape: one row of
# TRAIN_LEN tokens per step; step time, optimizer bytes, publish, decode unmerged / merged. Its
# phase peak is the larger of the two (full fine-tuning runs first in the same process).
BENCH_LORA=("$BIN" bench train --lora --config "$SHAPE" --device "$DEVICE" --dtype bf16
  --rows 1 --len "$TRAIN_LEN" --repeats 1 --batch 16)
# The multi-turn rollout workload on the paged engine and the legacy one (episodes/s ratio).
BENCH_ENGINE=("$BIN" bench engine --config "$SHAPE" --device "$DEVICE" --dtype bf16 --repeats 1
  "${ENGINE_WORKLOAD[@]}")
TORCH_COMMON=("$PY" bench/torch_ref.py "$SHAPE" --device "$TORCH_DEVICE" --dtype bfloat16 --runs 1 --jsonl)
TORCH_GEN=("${TORCH_COMMON[@]}" --skip-train --prefill --batches "$BATCHES" --prompt "$PROMPT" --new "$NEW")
TORCH_TRAIN_AMP=("${TORCH_COMMON[@]}" --skip-gen --train-batch "$TRAIN_BATCH" --train-len "$TRAIN_LEN"
  --train-precision amp)
TORCH_TRAIN_BF16=("${TORCH_COMMON[@]}" --skip-gen --train-batch "$TRAIN_BATCH" --train-len "$TRAIN_LEN"
  --train-precision same)
# The RL smoke: Cranfield task files (runs/data/cranfield, where the config reads them), then the run
# from scratch. The config names cuda:0; CUDA_VISIBLE_DEVICES makes that the chosen GPU.
DATA_PREP=("$BIN" data prepare --config configs/cranfield-hash.toml --out runs/data)
# Not --quiet, and with every phase traced (MTRL_TRACE=all): if the run stalls, the last lines of
# its .err file place the stall (the first GPU run printed nothing for 190 s).
RL_TRAIN=(env CUDA_VISIBLE_DEVICES="$GPU_INDEX" MTRL_TRACE=all "$BIN" train --config "$RL_CONFIG"
  --fresh --max-steps "$RL_STEPS")

if [[ "$DRY" == 1 ]]; then
  # Here there is no GPU: a cuda binary can only start against the libcuda stub of
  # scripts/setup-cuda.sh (every driver call answers "no device").
  if ! "$BIN" --version >/dev/null 2>&1; then
    stub="${MTRL_CUDA_RUN_LIBS:-}"
    if [[ -z "$stub" && -f "${MTRL_CUDA_DIR:-$HOME/.cache/mtrl/cu13}/env.sh" ]]; then
      stub="$(. "${MTRL_CUDA_DIR:-$HOME/.cache/mtrl/cu13}/env.sh" && echo "$MTRL_CUDA_RUN_LIBS")"
    fi
    [[ -n "$stub" ]] || die "$BIN does not start and no CUDA libraries are known (run scripts/setup-cuda.sh)"
    export LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "{\"check\":\"dry-run.libs\",\"note\":\"using the libcuda stub for the dry run\",\"LD_LIBRARY_PATH\":\"$stub\"}"
  fi
  info="$("$BIN" selftest --build-info)" || die "$BIN selftest --build-info failed"
  echo "{\"check\":\"dry-run.build\",\"bin\":\"$CARRIED\",\"carried_mib\":$(( $(stat -c %s "$CARRIED") / 1048576 )),\"unpacked_mib\":$(( $(stat -c %s "$BIN") / 1048576 )),\"build\":$info}"
  [[ "$info" == *'"cuda":true'* ]] || die "$CARRIED was built without the cuda feature"
  [[ "$info" == *'"flash_attn":true'* ]] \
    || echo '{"check":"dry-run.flash-attn","note":"built without --features flash-attn: mtrl-train runs the spelled attention"}'
  (( $(stat -c %s "$CARRIED") <= 64 * 1048576 )) || die "$CARRIED is over the 64 MiB carry limit (gzip it: --bin mtrl.gz)"
  help="$("$BIN" bench model --help)"
  for flag in --phases --batch-sizes --train-micro-batch --train-len --dtype --device --checkpointing --attention; do
    [[ "$help" == *"$flag"* ]] || die "mtrl bench model has no $flag"
  done
  "$BIN" selftest --help | grep -q -- --fixtures || die "mtrl selftest has no --fixtures"
  "$BIN" bench engine --help | grep -q -- --attention || die "mtrl bench engine has no --attention"
  help="$("$BIN" train --help)"
  for flag in --config --fresh --max-steps --quiet; do
    [[ "$help" == *"$flag"* ]] || die "mtrl train has no $flag"
  done
  "$BIN" data prepare --help | grep -q -- --out || die "mtrl data prepare has no --out"
  nodev="$("$BIN" selftest --device "$DEVICE" --fixtures "$FIXTURES" 2>&1 >/dev/null || true)"
  echo "{\"check\":\"dry-run.no-device\",\"stderr\":$(printf '%s' "$nodev" | "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}"
  "$PY" -c 'import ast,sys; [ast.parse(open(f).read()) for f in sys.argv[1:]]' bench/torch_ref.py bench/gpu_report.py \
    || die "python scripts do not parse"
  fixtures_mib=$(du -sm "$FIXTURES/golden/tiny-qwen3" "$FIXTURES/golden/tiny-qwen2" "$FIXTURES/tiny-qwen3" "$FIXTURES/tiny-qwen2" 2>/dev/null | awk '{s+=$1} END {print s}')
  echo "{\"check\":\"dry-run.args\",\"ok\":true,\"timeout_s\":$TIMEOUT,\"device\":\"$DEVICE\",\"out\":\"$OUTDIR\",\"fixtures_mib\":$fixtures_mib,\"torch_import\":\"skipped in dry run\"}"
  json step=selftest plan="${SELFTEST[*]}"
  json step=mtrl-train plan="${BENCH_TRAIN[*]}"
  json step=mtrl-train-spelled plan="${BENCH_TRAIN_SPELLED[*]}"
  json step=mtrl-lora plan="${BENCH_LORA[*]}"
  json step=mtrl-train-ckpt plan="${BENCH_TRAIN_CKPT[*]}"
  json step=mtrl-train-long plan="${BENCH_TRAIN_LONG[*]}"
  "$BIN" bench train --help | grep -q -- --lora || die "mtrl bench train has no --lora"
  json step=train-smoke plan="unpack $FIXTURES/qwen3-tokenizer into runs/qwen3-tokenizer; ${DATA_PREP[*]}; ${RL_TRAIN[*]}"
  for b in ${BATCHES//,/ }; do
    json step="mtrl-decode-$b" plan="${BENCH_DECODE[*]} $b --phases $([[ $b == "${BATCHES%%,*}" ]] && echo prefill,decode || echo decode)"
  done
  json step=mtrl-engine plan="${BENCH_ENGINE[*]}"
  json step=mtrl-engine-gathered plan="${BENCH_ENGINE[*]} --attention gathered"
  json step=torch-gen plan="${TORCH_GEN[*]}"
  json step=torch-train plan="${TORCH_TRAIN_AMP[*]}"
  json step=torch-train-bf16 plan="${TORCH_TRAIN_BF16[*]}"
  echo '{"check":"gpu-check","dry_run":true,"ok":true}'
  exit 0
fi

# ---- the real run -------------------------------------------------------------------------------
mkdir -p "$OUTDIR"
HAVE_SMI=0
if command -v nvidia-smi >/dev/null; then
  HAVE_SMI=1
  nvidia-smi -i "$GPU_INDEX" --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | "$PY" -c 'import json,sys; n,m,d=[x.strip() for x in sys.stdin.read().split(",")]; print(json.dumps({"check":"gpu","name":n,"memory_total":m,"driver":d}))' \
    | tee "$OUTDIR/gpu.json"
elif [[ "$SMOKE" != 1 ]]; then
  die "nvidia-smi not found: is this the GPU machine?"
fi

# The CUDA runtime libraries come from the machine (CUDA install or PyTorch's wheels).
missing="$(ldd "$BIN" | awk '/not found/{print $1}')"
if [[ -n "$missing" ]]; then
  dirs="$("$PY" - <<'EOF'
import glob, os, site, sys
roots = ["/usr/local/cuda/lib64", *sorted(glob.glob("/usr/local/cuda-13*/lib64"))]
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    roots += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    roots += sorted(glob.glob(os.path.join(sp, "nvidia", "cu13", "lib")))
print(":".join(r for r in dict.fromkeys(roots) if os.path.isdir(r)))
EOF
)"
  export LD_LIBRARY_PATH="${dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  still="$(ldd "$BIN" | awk '/not found/{print $1}' | tr '\n' ' ')"
  json check=libs searched="$dirs" missing_before="$(echo $missing)" missing_after="$still"
  [[ -z "$still" ]] || die "libraries not found: $still"
fi

mem_used() {
  if (( HAVE_SMI )); then
    nvidia-smi -i "$GPU_INDEX" --query-gpu=memory.used --format=csv,noheader,nounits | head -n1 | tr -d ' '
  else echo 0; fi
}
declare -A PEAK
FAILED=()
# run NAME OUTFILE CAP_SECONDS CMD...: runs CMD with a timeout (min(CAP, time left)), samples
# nvidia-smi beside it, keeps stdout in OUTFILE and echoes it, stderr in OUTFILE.err.
run() {
  local name="$1" out="$2" cap="$3"; shift 3
  local budget; budget=$(left)
  (( budget > cap )) && budget=$cap
  if (( budget < 10 )); then
    json step="$name" skipped="no time left"; FAILED+=("$name"); return 0
  fi
  local base; base=$(mem_used)
  : >"$OUTDIR/$name.mem"
  local sampler=""
  if (( HAVE_SMI )); then
    # Memory (MiB) and utilisation (%) every 200 ms: a stall shows as flat memory at 0 %.
    nvidia-smi -i "$GPU_INDEX" --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits \
      -lms 200 >"$OUTDIR/$name.mem" 2>/dev/null &
    sampler=$!
  fi
  local t0 rc=0; t0=$(date +%s)
  timeout --kill-after=10 "$budget" "$@" >"$out" 2>"$out.err" || rc=$?
  if [[ -n "$sampler" ]]; then kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; fi
  local peak; peak=$(cut -d, -f1 "$OUTDIR/$name.mem" | sort -n | tail -n1 | tr -d ' ')
  PEAK[$name]=$(( ${peak:-$base} - base ))
  cat "$out"
  json step="$name" rc="$rc" seconds="$(( $(date +%s) - t0 ))" budget_s="$budget" \
    peak_gpu_mem_mib="${PEAK[$name]}" stderr_tail="$(tail -c 600 "$out.err")"
  (( rc == 0 )) || FAILED+=("$name")
}

# The train smoke's inputs, all from the repository (the GPU machine has no network): the Qwen3
# tokenizer unpacked where configs/gpu-train-smoke.toml reads it, and Cranfield's task files.
rl_prepare() {
  mkdir -p runs/qwen3-tokenizer
  "$PY" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$FIXTURES/qwen3-tokenizer/tokenizer.json.gz" runs/qwen3-tokenizer/tokenizer.json
  cp "$FIXTURES/qwen3-tokenizer/tokenizer_config.json" runs/qwen3-tokenizer/
  # A scratch run: its earlier checkpoints (~8 GB at this shape) are removed, not kept aside.
  local dir; dir="$(sed -n 's/^dir = "\(.*\)".*/\1/p' "$RL_CONFIG")"
  [[ -n "$dir" ]] && rm -rf "configs/$dir"
  "${DATA_PREP[@]}"
}
# rl_summary: steps, wall time and throughput of the train smoke from its printed summary and the
# run's metrics.jsonl (copied to $OUTDIR), with the phase's peak GPU memory; one JSON line, also
# kept as train-smoke-summary.json for gpu_report.py.
rl_summary() {
  "$PY" - "$OUTDIR" "${PEAK[train-smoke]:-0}" "$DEVICE" <<'EOF'
import json, os, shutil, sys
out, peak, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def last_json(path):
    try:
        lines = [l for l in open(path) if l.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
run = last_json(os.path.join(out, "train-smoke.json"))
line = {"step": "train-smoke-summary", "device": device, "ok": run is not None}
if run:
    metrics = os.path.join(run["checkpoint_dir"], "metrics.jsonl")
    recs = []
    if os.path.exists(metrics):
        shutil.copy(metrics, os.path.join(out, "train-smoke-metrics.jsonl"))
        recs = [json.loads(l) for l in open(metrics) if l.strip()]
    elapsed = recs[-1]["elapsed_s"] if recs else 0.0
    rate = lambda k: round(sum(r[k] for r in recs) / elapsed, 3) if elapsed > 0 else None
    mean = lambda v: round(sum(v) / len(v), 3) if v else None
    failures = {}
    for r in recs:
        for k, n in r.get("failures", {}).items():
            failures[k] = failures.get(k, 0) + n
    line.update(
        steps=run["steps"], wall_s=round(run["wall_s"], 3), step_records=len(recs),
        train_elapsed_s=round(elapsed, 3),
        step_wall_s_mean=mean([r["step_wall_s"] for r in recs]),
        episodes=sum(r["sequences"] for r in recs), episodes_per_s=rate("sequences"),
        trained_tokens=sum(r["tokens"] for r in recs), trained_tokens_per_s=rate("tokens"),
        rollout_tokens_per_s_mean=mean([r["rollout_tokens_per_s"] for r in recs
                                        if r["rollout_tokens_per_s"] > 0]),
        learner_tokens_per_s_mean=mean([r["learner_tokens_per_s"] for r in recs]),
        time_generate_s=round(sum(r["time_generate_s"] for r in recs), 3),
        time_learn_s=round(sum(r["time_learn_s"] for r in recs), 3),
        turns_mean=mean([r["turns_mean"] for r in recs]), failures=failures,
        peak_gpu_mem_mib=peak)
print(json.dumps(line))
open(os.path.join(out, "train-smoke-summary.json"), "w").write(json.dumps(line) + "\n")
EOF
}

# Most important first: the total budget ($TIMEOUT) cuts the tail. The largest decode batch
# (slowest: per-sequence attention, host-side sampling) runs after the torch peers.
BATCH_LIST=(${BATCHES//,/ })
LAST=$(( ${#BATCH_LIST[@]} - 1 ))
run selftest "$OUTDIR/selftest.jsonl" 120 "${SELFTEST[@]}"
run mtrl-train "$OUTDIR/mtrl-train.json" 120 "${BENCH_TRAIN[@]}"
run mtrl-train-spelled "$OUTDIR/mtrl-train-spelled.json" 90 "${BENCH_TRAIN_SPELLED[@]}"
if rl_prepare >"$OUTDIR/train-prepare.log" 2>&1; then
  run train-smoke "$OUTDIR/train-smoke.json" 150 "${RL_TRAIN[@]}"
  rl_summary
else
  json step=train-smoke skipped="prepare failed" log_tail="$(tail -c 600 "$OUTDIR/train-prepare.log")"
  FAILED+=(train-smoke)
fi
run mtrl-lora "$OUTDIR/mtrl-lora.json" 120 "${BENCH_LORA[@]}"
for i in "${!BATCH_LIST[@]}"; do
  (( i == LAST && LAST > 0 )) && continue
  b="${BATCH_LIST[$i]}"
  phases=decode; (( i == 0 )) && phases=prefill,decode
  run "mtrl-decode-$b" "$OUTDIR/mtrl-decode-$b.json" 90 "${BENCH_DECODE[@]}" "$b" --phases "$phases"
done
run torch-gen "$OUTDIR/torch-gen.jsonl" 120 "${TORCH_GEN[@]}"
run torch-train "$OUTDIR/torch-train.jsonl" 90 "${TORCH_TRAIN_AMP[@]}"
if (( LAST > 0 )); then
  b="${BATCH_LIST[$LAST]}"
  run "mtrl-decode-$b" "$OUTDIR/mtrl-decode-$b.json" 150 "${BENCH_DECODE[@]}" "$b" --phases decode
fi
run mtrl-engine "$OUTDIR/mtrl-engine.json" 120 "${BENCH_ENGINE[@]}"
# The same workload with the engine's attention spelled out (gathered keys and values, masked
# attention): what the in-place paged kernel and FlashAttention-2 prefill buy on this card.
run mtrl-engine-gathered "$OUTDIR/mtrl-engine-gathered.json" 120 "${BENCH_ENGINE[@]}" \
  --attention gathered
run mtrl-train-ckpt "$OUTDIR/mtrl-train-ckpt.json" 90 "${BENCH_TRAIN_CKPT[@]}"
run mtrl-train-long "$OUTDIR/mtrl-train-long.json" 120 "${BENCH_TRAIN_LONG[@]}"
run torch-train-bf16 "$OUTDIR/torch-train-bf16.jsonl" 60 "${TORCH_TRAIN_BF16[@]}"
cat "$OUTDIR/torch-train-bf16.jsonl" >>"$OUTDIR/torch-train.jsonl" 2>/dev/null || true

{
  echo "{"
  first=1
  for k in "${!PEAK[@]}"; do
    (( first )) || echo ","
    first=0
    echo "\"$k\": ${PEAK[$k]}"
  done
  echo "}"
} >"$OUTDIR/mem.json"
# mem.json is one object; gpu_report.py reads the last JSON line, so flatten it.
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); open(sys.argv[1],"w").write(json.dumps(d)+"\n")' "$OUTDIR/mem.json"
"$PY" bench/gpu_report.py --dir "$OUTDIR" --shape "$SHAPE" | tee "$OUTDIR/report.jsonl"
if (( ${#FAILED[@]} )); then
  json check=gpu-check ok=false failed="${FAILED[*]}" seconds="$(( $(date +%s) - START ))"
  exit 1
fi
json check=gpu-check ok=true seconds="$(( $(date +%s) - START ))"
