#!/usr/bin/env bash
# Places the CUDA RL stall (docs/results/2026-12-04-h200-gpu-check.md: `mtrl train` on one H200 wrote no step and used
# 0 % of the GPU) in one short run on the GPU machine, about 5 minutes. Every variant runs the
# train smoke (configs/gpu-train-smoke.toml, one step, `[rollout] timeout_s = 20` so the
# stuck-rollout watchdog ends it in ~40 s) with `MTRL_TRACE=all` — the last trace line names the
# phase that hangs — and, if it is still running after DUMP seconds, a dump of every thread's
# state (`/proc/PID/task/*`: R = busy, S = waiting, and where) and, with gdb, their backtraces:
#   smoke     the smoke as it is;
#   blocking  CUDA_LAUNCH_BLOCKING=1 (a stall that goes away is a stream-ordering problem);
#   chunk     `prefill_chunk_tokens = 4096` (no prefill step without sampled rows);
#   tiny      the tiny random Qwen3 on the GPU (threading rather than the model's size);
#   engine    `mtrl bench engine` with 8 two-call episodes, traced (slow or stuck?).
# Output: one folder per variant under OUT (default runs/gpu-diagnose): trace.log, threads.txt,
# smi.csv (utilisation and memory every 200 ms), status (exit code; 124 = killed by the time
# limit).
#
#   scripts/gpu-diagnose.sh [--bin target/gpu/mtrl.gz] [--limit 75] [--dump 45] [variant…]
#   scripts/gpu-diagnose.sh --cpu --bin target/release/mtrl   # here: every variant on the CPU,
#                                                             # the tiny model (checks the script)
set -uo pipefail
cd "$(dirname "$0")/.."

BIN="${MTRL_BIN:-target/gpu/mtrl.gz}"
OUTDIR="${OUT:-runs/gpu-diagnose}"
PY="${PYTHON:-python3}"
FIXTURES="tests/fixtures"
LIMIT=75
DUMP=45
VARIANTS=()
CPU=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="${2:?--bin needs a path}"; shift ;;
    --limit) LIMIT="${2:?}"; shift ;;
    --dump) DUMP="${2:?}"; shift ;;
    --cpu) CPU=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) VARIANTS+=("$1") ;;
  esac
  shift
done
[[ ${#VARIANTS[@]} -gt 0 ]] || VARIANTS=(smoke blocking chunk tiny engine)
[[ -f "$BIN" ]] || { echo "no mtrl binary at $BIN" >&2; exit 2; }
if [[ "$BIN" == *.gz ]]; then
  tmpd="$(mktemp -d)"
  trap 'rm -rf "$tmpd"' EXIT
  "$PY" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$BIN" "$tmpd/mtrl" || exit 2
  chmod +x "$tmpd/mtrl"
  BIN="$tmpd/mtrl"
fi
mkdir -p "$OUTDIR" runs/qwen3-tokenizer
# The smoke's inputs, as scripts/gpu-check.sh prepares them (no network on the GPU machine).
"$PY" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  "$FIXTURES/qwen3-tokenizer/tokenizer.json.gz" runs/qwen3-tokenizer/tokenizer.json
cp "$FIXTURES/qwen3-tokenizer/tokenizer_config.json" runs/qwen3-tokenizer/
"$BIN" data prepare --config configs/cranfield-hash.toml --out runs/data >"$OUTDIR/prepare.log" 2>&1 \
  || { echo "data prepare failed: $OUTDIR/prepare.log" >&2; exit 2; }

# config VARIANT: the smoke's config with the variant's change, written next to the original so
# that its relative paths still resolve.
config() {
  local out="configs/.diagnose-$1.toml"
  sed -e '/^\[rollout\]/a timeout_s = 20' \
    -e "s#^dir = .*#dir = \"../runs/gpu-diagnose/$1/run\"#" configs/gpu-train-smoke.toml >"$out"
  if ((CPU)); then
    sed -i -e 's#^device = .*#device = "cpu"#' -e 's#^dtype = .*#dtype = "f32"#' \
      -e 's#^path = .*#path = "random:tiny"#' \
      -e 's#^tokenizer = .*#tokenizer = "../tests/fixtures/tiny-qwen3"#' "$out"
  fi
  case "$1" in
    chunk) sed -i '/^\[rollout\]/a prefill_chunk_tokens = 4096' "$out" ;;
    tiny) sed -i -e 's#^path = .*#path = "random:tiny"#' \
      -e 's#^tokenizer = .*#tokenizer = "../tests/fixtures/tiny-qwen3"#' "$out" ;;
  esac
  echo "$out"
}

# threads PID: every thread's name, state, kernel wait channel, and (gdb) backtraces.
threads() {
  local pid=$1
  for t in /proc/"$pid"/task/*; do
    printf '%s %s state=%s wchan=%s\n' "${t##*/}" "$(cat "$t/comm" 2>/dev/null)" \
      "$(awk '{print $3}' "$t/stat" 2>/dev/null)" "$(cat "$t/wchan" 2>/dev/null)"
  done
  if command -v gdb >/dev/null 2>&1; then
    timeout 30 gdb -p "$pid" -batch -ex 'thread apply all bt 12' 2>&1 | grep -v '^\[' | head -400
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
}

for v in "${VARIANTS[@]}"; do
  dir="$OUTDIR/$v"
  rm -rf "$dir" && mkdir -p "$dir"
  # Every phase traced, every forward (not only the first three) synchronised and timed.
  envs=(MTRL_TRACE=all)
  if [[ "$v" == engine ]]; then
    cmd=("$BIN" bench engine --config bench/qwen3-0.6b.json --device cuda:0 --dtype bf16
      --episodes 8 --calls 2 --repeats 1)
    ((CPU)) && cmd=("$BIN" bench engine --config tests/fixtures/tiny-qwen3/config.json
      --episodes 8 --calls 2 --repeats 1)
  else
    [[ "$v" == blocking ]] && envs+=(CUDA_LAUNCH_BLOCKING=1)
    cmd=("$BIN" train --config "$(config "$v")" --fresh --max-steps 1)
  fi
  t0=$(date +%s)
  # Utilisation and memory every 200 ms beside the run (a stall: flat memory at 0 %).
  smi=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 200 \
      >"$dir/smi.csv" 2>/dev/null &
    smi=$!
  fi
  env "${envs[@]}" timeout "$LIMIT" "${cmd[@]}" >"$dir/stdout.log" 2>"$dir/trace.log" &
  pid=$!
  # The mtrl process itself (timeout's child).
  sleep 2
  child="$(pgrep -P "$pid" | head -1)"
  while kill -0 "$pid" 2>/dev/null && (($(date +%s) - t0 < DUMP)); do sleep 1; done
  if kill -0 "$pid" 2>/dev/null && [[ -n "$child" ]]; then
    threads "$child" >"$dir/threads.txt" 2>&1
  fi
  wait "$pid"
  rc=$?
  [[ -n "$smi" ]] && { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }
  echo "$rc" >"$dir/status"
  printf '{"variant":"%s","exit":%s,"seconds":%s,"last_trace":%s}\n' "$v" "$rc" \
    "$(($(date +%s) - t0))" \
    "$("$PY" -c 'import json,sys; l=[x for x in open(sys.argv[1]) if x.startswith("[trace")]; print(json.dumps(l[-1].strip() if l else ""))' "$dir/trace.log")"
  rm -f "configs/.diagnose-$v.toml"
done
