#!/usr/bin/env python3
"""Turns the raw outputs of scripts/gpu-check.sh into one JSON line per figure, plus ratio lines.

Inputs (files in --dir, each optional; a missing or empty one yields a `missing` line):
  mtrl-decode-*.json `mtrl bench model --phases [prefill,]decode`, one batch size per file
  mtrl-train.json    `mtrl bench model --phases train` (one JSON object): [8, 2048] in one packed
                     forward, attention fused where the binary carries FlashAttention-2
  mtrl-train-spelled.json   the same batch with the spelled attention, one row per forward
  mtrl-train-ckpt.json, mtrl-train-long.json   the same with --checkpointing ([8, 2048] at once; one long row)
  gpu.json           the card (nvidia-smi name, memory, driver): names the MFU peak
  mtrl-engine.json   `mtrl bench engine` (paged vs legacy engine, one JSON object)
  mtrl-engine-gathered.json  the same with `--attention gathered`
  torch-gen.jsonl    `bench/torch_ref.py --jsonl --skip-train` (one line per figure)
  torch-train.jsonl  `bench/torch_ref.py --jsonl --skip-gen` (amp, then optionally bf16)
  mem.json           {"<phase>": peak MiB above the idle baseline, ...} from nvidia-smi sampling
  train-smoke-summary.json  the `mtrl train` smoke: steps, wall time, episodes/s, tokens/s

Goals (from the issues): mtrl decode >= 3x transformers generate at every batch size, and mtrl
train step (forward + backward + AdamW with f32 masters) >= 1.3x PyTorch eager (amp: f32 params +
AdamW, bf16 autocast — the same precision recipe). MFU (see mfu()): model FLOPs per token times
step tokens/s over the card's dense bf16 peak. Standard library only.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

DECODE_GOAL = 3.0
TRAIN_GOAL = 1.3
# Dense bf16 tensor-core peaks (FLOP/s) by nvidia-smi name, for MFU.
PEAKS = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12))


def mfu(tokens_per_s, params, cfg, gpu_name):
    """Model FLOPs utilisation of a training step: (6·N + 6·layers·heads·head_dim·L) FLOPs per
    token (weights: forward + backward; causal attention: half of 12·layers·width·L) at
    `tokens_per_s`, over the card's dense bf16 peak. None where the card or shape is unknown."""
    peak = next((p for n, p in PEAKS if gpu_name and n in gpu_name), None)
    if not (peak and params and cfg and tokens_per_s):
        return None
    width = cfg.get("num_attention_heads", 0) * cfg.get("head_dim", 0)
    flops = 6 * params + 6 * cfg.get("num_hidden_layers", 0) * width * cfg.get("L", 0)
    return round(flops * tokens_per_s / peak, 4)


def read_json(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    for line in reversed(text.splitlines()):  # the report is the last JSON line
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except OSError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--shape", help="the model's config.json (bench/qwen3-0.6b.json): for MFU")
    args = ap.parse_args()
    d = args.dir
    lines = []

    def emit(obj):
        lines.append(obj)
        print(json.dumps(obj), flush=True)

    decs = [r for r in (read_json(p) for p in sorted(glob.glob(os.path.join(d, "mtrl-decode*.json")))) if r]
    dec = None
    for r in decs:  # merge: one batch size per file, prefill in the first
        if dec is None:
            dec = dict(r, decode=[])
        if r.get("prefill_tokens_per_s") is not None:
            dec["prefill_tokens_per_s"] = r["prefill_tokens_per_s"]
        dec["decode"] += r.get("decode", [])
    if dec:
        dec["decode"].sort(key=lambda x: x["batch"])
    tr = read_json(os.path.join(d, "mtrl-train.json"))
    tgen = read_jsonl(os.path.join(d, "torch-gen.jsonl"))
    ttrain = read_jsonl(os.path.join(d, "torch-train.jsonl"))
    mem = read_json(os.path.join(d, "mem.json")) or {}
    rl = read_json(os.path.join(d, "train-smoke-summary.json"))
    eng = read_json(os.path.join(d, "mtrl-engine.json"))
    eng_gathered = read_json(os.path.join(d, "mtrl-engine-gathered.json"))

    mtrl = {}
    if dec:
        base = {"impl": "mtrl", "device": dec.get("device"), "dtype": dec.get("dtype"),
                "params": dec.get("num_parameters")}
        if dec.get("prefill_tokens_per_s") is not None:
            emit({**base, "figure": "prefill_tokens_per_s", "value": dec["prefill_tokens_per_s"],
                  "P": dec.get("prompt_len")})
        for r in dec.get("decode", []):
            for fig in ("decode_tokens_per_s", "generate_tokens_per_s"):
                emit({**base, "figure": fig, "batch": r["batch"], "value": r[fig],
                      "P": dec.get("prompt_len"), "N": dec.get("new_tokens")})
                mtrl[(fig, r["batch"])] = r[fig]
        if dec.get("device_mem_used_mib") is not None:
            emit({**base, "figure": "device_mem_used_mib_sampled", "phase": "decode",
                  "value": dec["device_mem_used_mib"]})
    else:
        emit({"impl": "mtrl", "figure": "decode", "missing": True})
    if tr:
        base = {"impl": "mtrl", "device": tr.get("device"), "dtype": tr.get("dtype"),
                "train_batch": tr.get("train_batch"), "L": tr.get("train_len"),
                "micro_batch": tr.get("train_micro_batch"),
                "fused_attention": tr.get("train_fused_attention"),
                "peak_gpu_mem_mib": mem.get("mtrl-train")}
        for fig in ("train_tokens_per_s", "train_step_tokens_per_s"):
            if tr.get(fig) is not None:
                emit({**base, "figure": fig, "value": tr[fig]})
                mtrl[(fig, None)] = tr[fig]
        if tr.get("device_mem_used_mib") is not None:
            emit({**base, "figure": "device_mem_used_mib_sampled", "phase": "train",
                  "value": tr["device_mem_used_mib"]})
    else:
        emit({"impl": "mtrl", "figure": "train", "missing": True})

    # The learner with activation checkpointing (whole batch in one forward; one long row), with
    # the phase's sampled peak (nvidia-smi, minus the idle baseline).
    for phase in ("mtrl-train-spelled", "mtrl-train-ckpt", "mtrl-train-long"):
        r = read_json(os.path.join(d, phase + ".json"))
        if not r:
            emit({"impl": "mtrl", "figure": phase, "missing": True})
            continue
        base = {"impl": "mtrl", "phase": phase, "device": r.get("device"), "dtype": r.get("dtype"),
                "train_batch": r.get("train_batch"), "L": r.get("train_len"),
                "micro_batch": r.get("train_micro_batch"),
                "checkpointing": r.get("train_checkpointing"),
                "fused_attention": r.get("train_fused_attention"), "peak_gpu_mem_mib": mem.get(phase)}
        for fig in ("train_tokens_per_s", "train_step_tokens_per_s"):
            if r.get(fig) is not None:
                emit({**base, "figure": fig, "value": r[fig]})

    if rl and rl.get("ok"):
        emit({"impl": "mtrl", "figure": "rl_train_smoke",
              **{k: v for k, v in rl.items() if k not in ("step", "ok")}})
    else:
        emit({"impl": "mtrl", "figure": "rl_train_smoke", "missing": True})

    if eng:
        emit({"impl": "mtrl", "figure": "engine_multi_turn", "device": eng.get("device"),
              "dtype": eng.get("dtype"), "workload": eng.get("workload"),
              "paged_episodes_per_s": eng["paged"]["episodes_per_s"],
              "legacy_episodes_per_s": eng["legacy"]["episodes_per_s"],
              "ratio": eng.get("episodes_per_s_ratio"), "kv_reuse_factor": eng.get("kv_reuse_factor")})
    else:
        emit({"impl": "mtrl", "figure": "engine_multi_turn", "missing": True})
    if eng and eng_gathered:
        a, g = eng["paged"]["episodes_per_s"], eng_gathered["paged"]["episodes_per_s"]
        emit({"impl": "mtrl", "figure": "engine_attention_ratio",
              "attention": (eng.get("workload") or {}).get("attention"),
              "episodes_per_s": a, "gathered_episodes_per_s": g,
              "ratio": round(a / g, 3) if g else None})

    torch = {}
    for r in tgen + ttrain:
        if "figure" not in r:
            continue
        emit(r)
        key = r["figure"], r.get("batch")
        if r["figure"] == "train_step_tokens_per_s":
            key = (r["figure"], "amp" if r.get("train_precision", "").startswith("amp") else "same")
        torch[key] = r["value"]
    if not tgen:
        emit({"impl": "torch+transformers", "figure": "generate", "missing": True})
    if not ttrain:
        emit({"impl": "torch+transformers", "figure": "train", "missing": True})
    for phase, mib in sorted(mem.items()):
        emit({"figure": "peak_gpu_mem_mib", "phase": phase, "value": mib,
              "method": "nvidia-smi memory.used sampled every 200 ms, max minus the idle baseline"})

    goals = []
    for (fig, b), v in sorted((k, v) for k, v in mtrl.items() if k[0] == "decode_tokens_per_s"):
        for peer_fig in ("generate_tokens_per_s", "decode_tokens_per_s"):
            t = torch.get((peer_fig, b))
            if not t:
                continue
            ratio = v / t
            line = {"figure": "ratio", "what": f"mtrl decode / transformers {peer_fig.split('_')[0]}",
                    "batch": b, "mtrl": v, "torch": t, "ratio": round(ratio, 3)}
            if peer_fig == "generate_tokens_per_s":
                line.update(goal=DECODE_GOAL, met=ratio >= DECODE_GOAL)
                goals.append(line["met"])
            emit(line)
        g, t = mtrl.get(("generate_tokens_per_s", b)), torch.get(("generate_tokens_per_s", b))
        if g and t:
            emit({"figure": "ratio", "what": "mtrl generate / transformers generate (both incl. prefill)",
                  "batch": b, "mtrl": g, "torch": t, "ratio": round(g / t, 3)})
    step = mtrl.get(("train_step_tokens_per_s", None))
    spelled = read_json(os.path.join(d, "mtrl-train-spelled.json")) or {}
    if step and spelled.get("train_step_tokens_per_s"):
        emit({"figure": "ratio", "what": "mtrl train step: packed batch, fused attention / one row, spelled",
              "mtrl": step, "spelled": spelled["train_step_tokens_per_s"],
              "ratio": round(step / spelled["train_step_tokens_per_s"], 3)})
    gpu = read_json(os.path.join(d, "gpu.json")) or {}
    shape = None
    if args.shape and os.path.exists(args.shape):
        with open(args.shape) as f:
            shape = json.load(f)
    for name, r in (("mtrl-train", tr), ("mtrl-train-spelled", spelled)):
        if r and shape:
            m = mfu(r.get("train_step_tokens_per_s"), r.get("num_parameters"),
                    {**shape, "L": r.get("train_len")}, gpu.get("name"))
            emit({"figure": "mfu", "phase": name, "gpu": gpu.get("name"), "value": m,
                  "method": "(6N + 6·layers·heads·head_dim·L) FLOP/token × step tokens/s / dense bf16 peak"})
    for prec in ("amp", "same"):
        t = torch.get(("train_step_tokens_per_s", prec))
        if step and t:
            line = {"figure": "ratio", "what": f"mtrl train step / torch eager train step ({prec})",
                    "mtrl": step, "torch": t, "ratio": round(step / t, 3)}
            if prec == "amp":
                line.update(goal=TRAIN_GOAL, met=step / t >= TRAIN_GOAL)
                goals.append(line["met"])
            emit(line)
    emit({"figure": "summary", "goals_checked": len(goals), "goals_met": sum(goals),
          "all_met": bool(goals) and all(goals)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
