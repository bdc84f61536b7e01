#!/usr/bin/env bash
# Bring-your-own-agent overhead (`mtrl bench agent`): the demo's test tasks, each sampled
# PER_TASK times (default 8, so 280 episodes), with at most CONCURRENCY (default 256) in flight,
# run in-process and through the plain Python agent (examples/agents/plain_agent.py: openai
# client + mtrl serve-tools) on the demo's SFT policy, side by side in one process.
# Usage: scripts/bench-agent.sh [path/to/mtrl] [extra `bench agent` flags]
# (default binary: a release build, built if missing; the demo's artifacts are made by
# `mtrl demo` when runs/demo/sft is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mtrl=${1:-target/release/mtrl}
shift || true
[ -x "$mtrl" ] || cargo build --release
[ -f runs/demo/sft/model.safetensors ] || "$mtrl" demo --quiet
py="$(scripts/agent-venv.sh)"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
sed "s|\"\\.\\./|\"$root/|g" configs/demo.toml | sed "s|\"demo-model.json\"|\"$root/configs/demo-model.json\"|" >"$work/demo.toml"
# Starts a server whose stdout says `listening on URL`; prints the URL.
serve() {
  local log=$1
  shift
  "$@" >"$log" 2>"$log.err" &
  pids+=($!)
  for _ in $(seq 600); do
    if grep -q "listening on" "$log"; then
      sed -n 's/.*listening on //p' "$log" | head -1
      return
    fi
    sleep 0.1
  done
  echo "bench-agent: $* did not start: $(cat "$log.err")" >&2
  exit 1
}
tools=$(serve "$work/tools.log" "$mtrl" serve-tools --quiet --config "$work/demo.toml" --addr 127.0.0.1:0)
agent=$(serve "$work/agent.log" "$py" examples/agents/plain_agent.py --port 0 --tools-url "$tools")
sed "s|^environment = \"search\"|environment = \"agent\"\nagent_url = \"$agent\"|" "$work/demo.toml" >"$work/agent.toml"
"$mtrl" bench agent --config "$work/agent.toml" --model runs/demo/sft "$@"
