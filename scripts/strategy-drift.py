#!/usr/bin/env python3
"""How the sampled strategy of an RL run drifts, step by step, from its training trajectories.

    scripts/strategy-drift.py runs/demo/rl/trajectories [--every 3]

Per printed step: the share of episodes that used both search tools, that submitted round-robin
(`"interleave": true`), that submitted fused by reciprocal rank (`"rrf": true`, env.submit_rrf),
the mean searches per episode, the mean reward, the failure rate, and the
mean within-group advantage (reward minus its group's mean, as GRPO centres it) of the
interleaved episodes — positive means the round-robin choice paid in that step's groups.
"""
import collections
import glob
import json
import os
import sys


def args(call):
    a = call.get("arguments")
    return a if isinstance(a, dict) else {}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    every = int(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 3
    path = sys.argv[1]
    files = sorted(glob.glob(os.path.join(path, "*.jsonl"))) if os.path.isdir(path) else [path]
    by_step = collections.defaultdict(list)
    for f in files:
        for line in open(f):
            r = json.loads(line)
            if r.get("kind", "train") == "train":
                by_step[r["step"]].append(r)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    print("step\tboth\tinterleave\trrf\tsearches\treward\tfail\tadv(interleave)\tn\tadv(rrf)\tn")
    last = max(by_step)
    for step in sorted(by_step):
        if step % every and step not in (1, last):
            continue
        rows = by_step[step]
        groups = collections.defaultdict(list)
        for r in rows:
            groups[r["task_id"]].append(r)
        feats = {}
        for r in rows:
            calls = [c for c in r["tool_calls"] if c["name"] != "submit"]
            submits = [c for c in r["tool_calls"] if c["name"] == "submit"]
            feats[id(r)] = (
                len({c["name"] for c in calls}) == 2,
                bool(submits and args(submits[-1]).get("interleave")),
                len(calls),
                bool(submits and args(submits[-1]).get("rrf")),
            )
        adv, adv_rrf = [], []
        for g in groups.values():
            m = mean([x["reward"] for x in g])
            adv += [x["reward"] - m for x in g if feats[id(x)][1]]
            adv_rrf += [x["reward"] - m for x in g if feats[id(x)][3]]
        print(
            f"{step}\t{mean([feats[id(r)][0] for r in rows]):.2f}"
            f"\t{mean([feats[id(r)][1] for r in rows]):.2f}"
            f"\t{mean([feats[id(r)][3] for r in rows]):.2f}"
            f"\t{mean([feats[id(r)][2] for r in rows]):.2f}"
            f"\t{mean([r['reward'] for r in rows]):.3f}"
            f"\t{mean([r['failure'] is not None for r in rows]):.3f}"
            f"\t{mean(adv):+.3f}\t{len(adv)}"
            f"\t{mean(adv_rrf):+.3f}\t{len(adv_rrf)}"
        )


if __name__ == "__main__":
    main()
