#!/usr/bin/env bash
# The search tools side by side with the Python stack a user would otherwise pick, on one corpus,
# the same cores, back to back: bench/search_peers.py (sentence-transformers, hnswlib, bm25s) then
# `mtrl bench search --peer`, which prints both sides and the ratios (JSON, `vs_peer`).
#
#   scripts/bench-search.sh [COLLECTION]     # vaswani (default), cranfield or musique
#
# CPUS (default 0,1) pins both programs to the same cores; the peer's venv is made once in
# .venv-peer with the versions pinned below. Writes runs/bench/search-COLLECTION-{peer,mtrl}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
coll="${1:-vaswani}"
cpus="${CPUS:-0,1}"
threads=$(( $(tr -cd , <<<"$cpus" | wc -c) + 1 ))
case "$coll" in
  vaswani) data=data/vaswani; cfg=configs/vaswani.toml ;;
  cranfield) data=data/cranfield; cfg=configs/cranfield.toml ;;
  musique) data=data/musique-hipporag100; cfg=configs/musique.toml ;;
  *) echo "unknown collection $coll (vaswani, cranfield, musique)" >&2; exit 2 ;;
esac
first() { for f in "$@"; do [ -e "$f" ] && { echo "$f"; return; }; done; echo "no $* " >&2; exit 1; }
docs=$(first "$data"/docs.* "$data"/corpus.*)
queries=$(first "$data"/queries.*)
scripts/fetch-embedder.sh >/dev/null
if [ ! -x .venv-peer/bin/python ]; then
  python3 -m venv .venv-peer
  .venv-peer/bin/pip install -q torch==2.15.0 sentence-transformers==6.2.0 transformers==5.24.0 \
    hnswlib==0.8.0 bm25s==0.3.16 PyStemmer==3.1.0 numba==0.68.1 numpy==2.4.6
fi
cargo build --release --bin mtrl
mkdir -p runs/bench
peer="runs/bench/search-$coll-peer.json"
taskset -c "$cpus" .venv-peer/bin/python bench/search_peers.py --docs "$docs" \
  --queries "$queries" --qrels "$data/qrels.tsv" --model models/all-minilm-l6-v2 \
  --threads "$threads" --encode-docs 2000 --out "$peer" >/dev/null
RAYON_NUM_THREADS="$threads" taskset -c "$cpus" target/release/mtrl bench search --config "$cfg" \
  --concurrency 64 --embed-docs 2000 --peer "$peer" > "runs/bench/search-$coll-mtrl.json"
python3 - "runs/bench/search-$coll-mtrl.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{'figure':<78} {'mtrl':>10} {'peer':>10} {'ratio':>7}")
for row in r["vs_peer"]:
    print(f"{row['figure']:<78} {row['mtrl']:>10.4g} {row['peer']:>10.4g} {row['ratio']:>7.3f}  ({row['better']} is better)")
PY
