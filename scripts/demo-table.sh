#!/usr/bin/env bash
# The default job's table (docs/results/): the same recipe (configs/demo.toml and its two copies with other
# paths) on Cranfield, Vaswani and MuSiQue-100, seeds 0 1 2, then `mtrl demo-table` (mean ± sd over
# seeds, bootstrap intervals per collection and pooled). Usage:
#   scripts/demo-table.sh [test|validation] [seeds...]     (default: test 0 1 2)
# Runs go to runs/table-<split>/<collection>-s<seed>/; the table to runs/table-<split>/table.md.
# COLLECTIONS="vaswani musique" runs a subset. Release build; ~5-10 minutes per run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
split="${1:-test}"
shift || true
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2)
cargo build --release --quiet
out="runs/table-$split"
mkdir -p "$out"
dirs=()
for c in ${COLLECTIONS:-cranfield vaswani musique}; do
  case $c in
    cranfield) cfg=configs/demo.toml ;;
    *) cfg=configs/demo-$c.toml ;;
  esac
  for s in "${seeds[@]}"; do
    d="$out/$c-s$s"
    echo "== $c seed $s → $d" >&2
    ./target/release/mtrl demo --config "$cfg" --seed "$s" --split "$split" --run-dir "$d" --quiet \
      > "$d.out" 2> "$d.err" || { cat "$d.err" >&2; exit 1; }
    tail -1 "$d.out" >&2
    dirs+=("$d")
  done
done
./target/release/mtrl demo-table "${dirs[@]}" | tee "$out/table.md"
