#!/usr/bin/env python3
"""Assembles runs/qwen-agent/*/<collection>/eval.json (scripts/qwen-agent-table.sh) into the
Markdown tables of docs/results/2026-12-07-qwen2.5-0.5b-agent.md. Standard library only."""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "runs/qwen-agent"
FAIL = ["turn_limit", "token_limit", "context_overflow", "no_answer", "invalid_answer"]
CALL = ["malformed_call", "unknown_tool", "invalid_arguments", "too_many_calls"]
NAMES = {"strict-builtin": "Qwen2.5-0.5B, strict calls, built-in prompt",
         "tolerant-strictprompt": "Qwen2.5-0.5B, tolerant calls, stricter prompt"}


def load(variant, c):
    p = os.path.join(out, variant, c, "eval.json")
    return json.load(open(p)) if os.path.exists(p) else None


def f(v, p=4):
    return "-" if v is None else f"{v:.{p}f}"


print("| collection | agent | nDCG@10 | fail rate | sampled fail rate | turns | tokens/task | s/task | "
      + " | ".join(FAIL + CALL) + " |")
print("|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(FAIL) + len(CALL)))
for c in ["cranfield", "vaswani", "musique"]:
    rows = []
    for variant in ["strict-builtin", "tolerant-strictprompt"]:
        r = load(variant, c)
        if r is None:
            continue
        ds = r["datasets"][0]
        for run in ds["runs"]:
            if run["kind"] == "policy":
                rows.append((NAMES[variant], run, ds["size"]))
            elif variant == "strict-builtin":
                rows.append((f"`{run['label']}` (scripted)", run, ds["size"]))
    rows.sort(key=lambda x: 0 if "Qwen" in x[0] else 1)
    for name, run, n in rows:
        s = run["summary"]
        fails = [f(s["failures"].get(k, 0) / n, 2) for k in FAIL]
        calls = [f(s.get("call_errors", {}).get(k, 0) / n, 2) for k in CALL]
        scripted = run["kind"] != "policy"
        print(f"| {c} ({n}) | {name} | {f(s['ndcg_at_10'])} | {f(s['fail_rate'], 3)} | "
              f"{'-' if scripted else f(s.get('sampled_fail_rate'), 3)} | {f(s['turns'], 2)} | "
              f"{f(s.get('tokens_per_task'), 1)} | {'-' if scripted else f(s['s_per_task'], 2)} | "
              + " | ".join(fails + calls) + " |")

print()
print("| parser | prompt | nDCG@10 | fail rate | submitted | turns | tokens/task | s/task | " + " | ".join(FAIL + CALL) + " |")
print("|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(FAIL) + len(CALL)))
for syntax in ["strict", "tolerant"]:
    for prompt in ["builtin", "strict", "steps"]:
        r = load(f"grid-{syntax}-{prompt}", "cranfield")
        if r is None:
            continue
        ds = r["datasets"][0]
        n = ds["size"]
        run = [x for x in ds["runs"] if x["kind"] == "policy"][0]
        s = run["summary"]
        # submitted: greedy episodes that ended with an answer (not failed)
        submitted = sum(1 for t in run["tasks"] if t.get("failure") is None)
        fails = [f(s["failures"].get(k, 0) / n, 2) for k in FAIL]
        calls = [f(s.get("call_errors", {}).get(k, 0) / n, 2) for k in CALL]
        print(f"| {syntax} | {prompt} | {f(s['ndcg_at_10'])} | {f(s['fail_rate'], 3)} | {submitted}/{n} | "
              f"{f(s['turns'], 2)} | {f(s.get('tokens_per_task'), 1)} | {f(s['s_per_task'], 2)} | "
              + " | ".join(fails + calls) + " |")
