#!/usr/bin/env bash
# The table of docs/results/2026-12-07-qwen2.5-0.5b-agent.md: the real Qwen2.5-Coder-0.5B-Instruct
# (scripts/fetch-qwen.sh) as a search agent on the test splits of Cranfield, Vaswani and
# MuSiQue-100, against the scripted baselines, under the two knobs that decide what the model's
# text counts as: `env.tool_calls` (strict | tolerant) and the system prompt (built-in |
# STRICT_PROMPT | STEPS_PROMPT below). Every run writes eval.md/json/csv and trajectories.jsonl under runs/qwen-agent/<variant>/<collection>/.
#
#   scripts/qwen-agent-table.sh            # needs: scripts/fetch-qwen.sh, scripts/fetch-embedder.sh,
#                                          # mtrl data prepare --config configs/<collection>.toml
# Env: MTRL (the binary, default target/release/mtrl), K (sampled attempts per task at the strict
# setting, default 2), K_TOLERANT (at the tolerant one, whose episodes run all 4 turns, default 0;
# the published Cranfield row used 1),
# GRID_LIMIT (Cranfield tasks of the 2×2 knob grid, default 12). A run whose eval.json exists is
# kept (rerun after a stop to finish the table).
set -euo pipefail
cd "$(dirname "$0")/.."
mtrl="${MTRL:-target/release/mtrl}"
model=models/qwen2.5-coder-0.5b-instruct/model.gguf
k="${K:-2}"
k_tolerant="${K_TOLERANT:-0}"
grid_limit="${GRID_LIMIT:-12}"
out=runs/qwen-agent
mkdir -p "$out"
STRICT_PROMPT='You are a search agent. Find the documents of the collection most relevant to the user'"'"'s query. You have at most 4 turns. In each turn write exactly one tool call and nothing else, in this form:
<tool_call>
{"name": "bm25_search", "arguments": {"query": "a few keywords"}}
</tool_call>
Search once or twice with different keywords, then call submit with the doc_id values from the results, most relevant first, for example:
<tool_call>
{"name": "submit", "arguments": {"doc_ids": ["166", "488"]}}
</tool_call>
Never repeat a search you already made. Use only doc_id values that appeared in the results.'
STEPS_PROMPT='You are a search agent. Answer in exactly two turns.
Turn 1: search the collection with one tool call:
<tool_call>
{"name": "bm25_search", "arguments": {"query": "key words of the question"}}
</tool_call>
Turn 2: read the results and submit the doc_id values of the relevant documents, best first, with one tool call:
<tool_call>
{"name": "submit", "arguments": {"doc_ids": ["12", "7", "40"]}}
</tool_call>
Write nothing but the tool call. Do not search twice.'

# variant_config COLLECTION SYNTAX PROMPT(builtin|strict|steps) -> path of a config in $out
variant_config() {
  local c="$1" syntax="$2" prompt="$3" f="$out/$1-$2-$3.toml"
  sed -e "s/^tool_calls = \"strict\"/tool_calls = \"$syntax\"/" -e 's|"\.\./|"../../|g' "configs/qwen2.5-0.5b-$c.toml" > "$f"
  if [ "$prompt" != builtin ]; then
    local text="$STRICT_PROMPT"
    [ "$prompt" = steps ] && text="$STEPS_PROMPT"
    python3 - "$f" "$text" <<'PY'
import json, sys
path, prompt = sys.argv[1], sys.argv[2]
text = open(path).read().replace("[env]\n", "[env]\nsystem_prompt = " + json.dumps(prompt) + "\n", 1)
open(path, "w").write(text)
PY
  fi
  printf '\n[logging]\ntrajectories = true\n' >> "$f"
  # The edits must have taken: a silent no-op would publish the default setting under another name.
  grep -q "^tool_calls = \"$syntax\"$" "$f" || { echo "$f: tool_calls not set to $syntax" >&2; exit 1; }
  if [ "$prompt" != builtin ]; then grep -q '^system_prompt = ' "$f" || { echo "$f: no system_prompt" >&2; exit 1; }; fi
  echo "$f"
}

run() {  # run VARIANT COLLECTION SYNTAX PROMPT [extra eval args]
  local v="$1" c="$2" syntax="$3" prompt="$4"; shift 4
  if [ -f "$out/$v/$c/eval.json" ]; then echo "== $v $c: kept" >&2; return; fi
  local cfg; cfg="$(variant_config "$c" "$syntax" "$prompt")"
  echo "== $v $c (tool_calls=$syntax, prompt=$prompt) $*" >&2
  "$mtrl" eval --config "$cfg" --model "$model" --out "$out/$v/$c" --quiet "$@" >/dev/null
}

# 1. The two ends on every collection, greedy and K sampled attempts, with the scripted baselines:
#    the managed service's default (strict, built-in prompt) and the most lenient (tolerant, stricter prompt).
for c in cranfield vaswani musique; do
  run strict-builtin "$c" strict builtin --k "$k" --policy bm25-once --policy vector-once --policy hybrid-rrf
  run tolerant-strictprompt "$c" tolerant strict --k "$k_tolerant"
done
# 2. The grid of the knobs on the first GRID_LIMIT Cranfield tasks, greedy: both parsers × three
#    prompts (built-in; STRICT_PROMPT, which names the format; STEPS_PROMPT, which also prescribes
#    search-then-submit).
for syntax in strict tolerant; do
  for prompt in builtin strict steps; do
    run "grid-$syntax-$prompt" cranfield "$syntax" "$prompt" --k 0 --limit "$grid_limit"
  done
done
echo "done: $out" >&2
