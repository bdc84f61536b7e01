#!/usr/bin/env bash
# One device call for a whole GPU session (the device tool runs one command, at most 10 minutes):
#   1. scripts/gpu-diagnose.sh, variants `smoke` and `chunk` (the RL smoke traced with
#      MTRL_TRACE=all, utilisation and memory sampled every 200 ms, thread dumps if it hangs):
#      about 2.5 minutes at most, much less when the smoke runs through;
#   2. scripts/gpu-check.sh with what is left of the budget (selftest with the kernel-vs-twin
#      checks, decode sweep, train step, RL smoke, LoRA, engine bench, the PyTorch/transformers
#      peer in the same call, the report).
# Output under OUT (the device tool's $OUT comes back; default runs/gpu-session): diagnose/,
# check/, session.json (the card, the commit, each part's exit status and seconds). Copy it to
# bench/results/<card>-<date>/ afterwards.
#
#   scripts/gpu-session.sh [--bin target/gpu/mtrl.gz] [--budget 540]
#   scripts/gpu-session.sh --cpu --bin target/release/mtrl --budget 300   # the plumbing, here
set -uo pipefail
cd "$(dirname "$0")/.."

BIN="target/gpu/mtrl.gz"
BUDGET=540
CPU=0
OUTDIR="${OUT:-runs/gpu-session}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="${2:?--bin needs a path}"; shift ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift ;;
    --cpu) CPU=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "--budget must be seconds" >&2; exit 2; }
mkdir -p "$OUTDIR"
t0=$(date +%s)
card="cpu"
if command -v nvidia-smi >/dev/null; then
  card="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
fi

cpu_flag=()
((CPU)) && cpu_flag=(--cpu)
OUT="$OUTDIR/diagnose" scripts/gpu-diagnose.sh --bin "$BIN" --limit 60 --dump 40 "${cpu_flag[@]}" \
  smoke chunk >"$OUTDIR/diagnose.log" 2>&1
diag=$?
diag_s=$(($(date +%s) - t0))
cat "$OUTDIR/diagnose.log"

left=$((BUDGET - diag_s - 20))
check=skipped
if ((left >= 60)); then
  smoke_flag=()
  ((CPU)) && smoke_flag=(--cpu-smoke)
  scripts/gpu-check.sh --bin "$BIN" --timeout "$left" --out "$OUTDIR/check" "${smoke_flag[@]}" \
    >"$OUTDIR/check.log" 2>&1
  check=$?
  tail -n 40 "$OUTDIR/check.log"
fi
printf '{"session":"gpu","card":"%s","commit":"%s","budget_s":%s,"diagnose_exit":%s,"diagnose_s":%s,"check_exit":"%s","total_s":%s}\n' \
  "$card" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$BUDGET" "$diag" "$diag_s" \
  "$check" "$(($(date +%s) - t0))" | tee "$OUTDIR/session.json"
