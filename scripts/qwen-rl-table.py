#!/usr/bin/env python3
"""The before/after table of the real-model RL job (docs/real-model-rl.md) from its eval.json files.

    scripts/qwen-rl-table.py RUN_DIR

RUN_DIR holds `cranfield/eval.json` (the job's own evaluation: base, sft, tuned and the
baselines) and `vaswani/`, `musique/` with three reports each (`base/eval.json`: the model as
fetched and the scripted baselines; `sft/eval.json`, `tuned/eval.json`: the adapters), as
scripts/qwen-rl-table.sh writes them.

Prints per collection nDCG@10, failure rate and turns of every contender, the failure kinds of
base, sft and tuned, and paired bootstrap 95 % intervals of tuned − base, tuned − sft and
sft − base per collection and pooled over the collections' tasks (2000 resamples, seed 0).
Standard library only.
"""

import json
import random
import sys
from pathlib import Path

ORDER = ["base", "sft", "tuned", "bm25-once", "vector-once", "hybrid-rrf", "teacher-best"]


def runs_of(path, rename=None):
    d = json.loads(Path(path).read_text())["datasets"][0]
    out = {}
    for r in d["runs"]:
        label = (rename or {}).get(r["label"], r["label"])
        out[label] = r
    return d["size"], out


def collection(run_dir, name):
    d = Path(run_dir) / name
    if (d / "eval.json").is_file():
        return runs_of(d / "eval.json")
    size, runs = runs_of(d / "base" / "eval.json", {"model": "base"})
    for label in ("sft", "tuned"):
        _, more = runs_of(d / label / "eval.json", {"model": label})
        runs.update(more)
    return size, runs


def ndcg_by_task(run):
    return {t["task_id"]: t["ndcg_at_10"] for t in run["tasks"]}


def bootstrap(pairs, resamples=2000, seed=0, level=0.95):
    """Paired bootstrap of the mean difference: (mean, low, high)."""
    if not pairs:
        return (float("nan"),) * 3
    diffs = [a - b for a, b in pairs]
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return sum(diffs) / n, lo, hi


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run_dir = sys.argv[1]
    names = [n for n in ["cranfield", "vaswani", "musique"] if (Path(run_dir) / n).is_dir()]
    print("| collection | agent | nDCG@10 | fail rate | turns |")
    print("|---|---|---:|---:|---:|")
    data, sizes = {}, {}
    for name in names:
        size, runs = collection(run_dir, name)
        data[name], sizes[name] = runs, size
        for label in ORDER:
            r = runs.get(label)
            if r is None:
                continue
            s = r["summary"]
            print(f"| {name} ({size}) | {label} | {s['ndcg_at_10']:.4f} | {s['fail_rate']:.3f} | {s['turns']:.2f} |")
    print()
    print("Failure kinds (greedy episodes ending so, of the collection's tasks):")
    print()
    kinds = sorted({k for runs in data.values() for l in ("base", "sft", "tuned") if l in runs
                    for k in runs[l]["summary"].get("failures", {})})
    print("| collection | agent | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---:|" * len(kinds))
    for name, runs in data.items():
        for label in ("base", "sft", "tuned"):
            if label in runs:
                f = runs[label]["summary"].get("failures", {})
                cells = " | ".join(f"{f.get(k, 0)}/{sizes[name]}" for k in kinds)
                print(f"| {name} | {label} | {cells} |")
    print()
    print("Paired bootstrap 95 % intervals of the nDCG@10 difference (2000 resamples, seed 0):")
    print()
    print("| collection | difference | mean | 95 % interval | tasks |")
    print("|---|---|---:|---|---:|")
    for a, b in [("tuned", "base"), ("tuned", "sft"), ("sft", "base"), ("tuned", "bm25-once")]:
        allpairs = []
        for name, runs in data.items():
            if a not in runs or b not in runs:
                continue
            x, y = ndcg_by_task(runs[a]), ndcg_by_task(runs[b])
            pairs = [(x[t], y[t]) for t in x if t in y]
            allpairs += pairs
            m, lo, hi = bootstrap(pairs)
            print(f"| {name} | {a} − {b} | {m:+.4f} | [{lo:+.4f}, {hi:+.4f}] | {len(pairs)} |")
        m, lo, hi = bootstrap(allpairs)
        print(f"| pooled | {a} − {b} | {m:+.4f} | [{lo:+.4f}, {hi:+.4f}] | {len(allpairs)} |")


if __name__ == "__main__":
    main()
