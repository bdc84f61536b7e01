#!/usr/bin/env python3
"""LoRA memory arithmetic for single-GPU Qwen3 training with mtrl (computed, not measured).

Prints the tables and sums of docs/gpu.md "LoRA memory arithmetic" (stdlib only, no network):

    python3 scripts/lora-memory.py            # everything
    python3 scripts/lora-memory.py --rank 16  # another rank (docs/gpu.md uses 32)

Conventions are those of docs/gpu.md "GPU memory arithmetic": bf16 weights, GB = 10^9 bytes,
MB = 10^6 bytes, KiB = 1,024 bytes; attention keeps 12 * heads * layers * b * T^2 bytes; the linear
activations of the full fine-tuning forward are (40*hidden + 33*(q_dim + kv_dim) + 8*intermediate)
bytes per token and layer. What LoRA changes:

* base weights: 2 B/p, frozen (no master copy, no moments, no gradients), SHARED with the rollout
  engine under `serving = "unmerged"`;
* adapter A [r, in] and B [out, r] per targeted linear: bf16 weights 2 B + f32 master 4 B + f32
  moments 8 B + the engine's bf16 copy 2 B = 16 B per adapter parameter resident; during a step the
  f32 gradient sum 4 B + the bf16 gradients of the current micro-batch 2 B = 22 B at the peak;
* `serving = "merged"` adds a bf16 working copy W + s*B*A of every targeted weight in the engine:
  + 2 B per targeted base parameter (the adapter copy is still counted);
* activations: the full fine-tuning formula unchanged (x is still kept: dA needs it, and the frozen
  product's dx goes through W), plus, per adapted module and token, what candle's graph keeps of
  y = x*W^T + s*((x*A^T)*B^T): the rank-r intermediate h = x*A^T (2r bytes) and THREE out-sized bf16
  tensors (h*B^T, its scaled copy s*h*B^T, and the sum, the base product x*W^T being the one out-sized
  tensor the full-FT formula already counts): 2r + 6*out bytes. (Counting only h and one delta,
  2r + 2*out, would be the optimistic reading; this script takes the conservative one.)
* AdamW: ~5 f32 temporaries of the largest trainable tensor (r x intermediate here);
* the logits of one chunk and its backward: counted as 8 f32 buffers of 2^25 values (1.07 GB);
* engine KV cache: rollout_max_concurrency * max_context_tokens positions (set as
  `[rollout] kv_cache_tokens`; the code's default is twice that).

A configuration fits when its total is at most 90 % of the card (141e9 B for an H200, 80e9 B for an
80 GB card); the other 10 % is left for the CUDA context and cuBLAS workspace, allocator
fragmentation, the backward's transient gradients (one layer at a time) and the engine's step.
"""

import argparse

GB = 1e9
MB = 1e6
KIB = 1024
CARDS = [("H200 141 GB", 141e9), ("80 GB", 80e9)]
MARGIN = 0.10
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LOGITS_BYTES = 8 * (1 << 25) * 4
DELTA_OUT_TENSORS = 3  # out-sized bf16 tensors the graph keeps per adapted module, beyond the full-FT count

# config.json of each model (huggingface.co/Qwen/<name>); head_dim is 128 throughout, vocab 151,936.
MODELS = [
    dict(name="Qwen3-0.6B", layers=28, heads=16, kv=8, head_dim=128, hidden=1024, inter=3072, vocab=151936, tied=True),
    dict(name="Qwen3-4B", layers=36, heads=32, kv=8, head_dim=128, hidden=2560, inter=9728, vocab=151936, tied=True),
    dict(name="Qwen3-8B", layers=36, heads=32, kv=8, head_dim=128, hidden=4096, inter=12288, vocab=151936, tied=False),
    dict(name="Qwen3-14B", layers=40, heads=40, kv=8, head_dim=128, hidden=5120, inter=17408, vocab=151936, tied=False),
    dict(name="Qwen3-32B", layers=64, heads=64, kv=8, head_dim=128, hidden=5120, inter=25600, vocab=151936, tied=False),
]

# The configs in configs/: (file, model, card, max_context_tokens = micro_batch_tokens,
# rollout_max_concurrency).
CONFIGS = [
    ("qwen3-8b-lora.toml", "Qwen3-8B", "H200 141 GB", 1792, 32),
    ("qwen3-8b-lora-80gb.toml", "Qwen3-8B", "80 GB", 1024, 16),
    ("qwen3-14b-lora.toml", "Qwen3-14B", "H200 141 GB", 1280, 16),
]


def linears(m):
    """(name, in, out) of one layer's linears."""
    h, q, kv, i = m["hidden"], m["heads"] * m["head_dim"], m["kv"] * m["head_dim"], m["inter"]
    return [
        ("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h),
        ("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h),
    ]


def base_params(m):
    per_layer = sum(a * b for _, a, b in linears(m))
    per_layer += 2 * m["head_dim"]  # q_norm, k_norm
    per_layer += 2 * m["hidden"]  # input_layernorm, post_attention_layernorm
    embed = m["vocab"] * m["hidden"]
    return embed + m["layers"] * per_layer + m["hidden"] + (0 if m["tied"] else embed)


def targeted_params(m, targets):
    return m["layers"] * sum(a * b for n, a, b in linears(m) if n in targets)


def adapter_params(m, r, targets):
    return m["layers"] * sum(r * (a + b) for n, a, b in linears(m) if n in targets)


def largest_adapter_tensor(m, r, targets):
    return max(r * max(a, b) for n, a, b in linears(m) if n in targets)


def kv_per_token(m):
    return 2 * m["layers"] * m["kv"] * m["head_dim"] * 2


def attention(m, b, t):
    return 12 * m["heads"] * m["layers"] * b * t * t


def linear_full(m):
    q, kv = m["heads"] * m["head_dim"], m["kv"] * m["head_dim"]
    return m["layers"] * (40 * m["hidden"] + 33 * (q + kv) + 8 * m["inter"])


def linear_lora(m, r, targets):
    return m["layers"] * sum(2 * r + 2 * DELTA_OUT_TENSORS * b for n, _, b in linears(m) if n in targets)


def parts(m, r, targets, t, b, kv_tokens):
    """The terms of one configuration's peak, in bytes (one micro-batch of b rows of t tokens)."""
    na = adapter_params(m, r, targets)
    return [
        ("base", 2 * base_params(m)),
        ("adapter 16 B/p", 16 * na),
        ("adapter grads 6 B/p", 6 * na),
        ("AdamW temporaries", 5 * 4 * largest_adapter_tensor(m, r, targets)),
        ("attention", attention(m, b, t)),
        ("linear", (linear_full(m) + linear_lora(m, r, targets)) * b * t),
        ("logits chunk", LOGITS_BYTES),
        ("KV", kv_tokens * kv_per_token(m)),
    ]


def total(m, r, targets, t, b, kv_tokens):
    return sum(v for _, v in parts(m, r, targets, t, b, kv_tokens))


def fits(bytes_, cap):
    return bytes_ <= (1 - MARGIN) * cap


def g(x):
    """Bytes as GB docs/gpu.md's way: 1 decimal, 2 below 10 GB."""
    v = x / GB
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def arch(m):
    tie = ", tied" if m["tied"] else ""
    return f"{m['name']} ({m['layers']}, {m['heads']}/{m['kv']}, {m['hidden']}, {m['inter']}{tie})"


def params_b(n):
    v = n / 1e9
    return f"{v:.3f} B" if v < 1 else (f"{v:.2f} B" if v < 10 else f"{v:.1f} B")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight for the fit table")
    args = ap.parse_args()
    r, tg, conc = args.rank, TARGETS, args.concurrency
    by_name = {m["name"]: m for m in MODELS}

    print(f"LoRA rank {r}, alpha {2 * r}, targets: {', '.join(tg)} (computed, not measured)\n")
    print("| model (layers, heads/kv, hidden, intermediate) | base params | adapter params | "
          "resident: base 2 B/p + adapter 16 B/p | + adapter grads 6 B/p | KV / token | "
          "attention, one row of T = 1,024 / 2,048 / 4,096 | linear act. / token: full FT + LoRA | "
          "merged serving adds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in MODELS:
        p, na = base_params(m), adapter_params(m, r, tg)
        att = " / ".join(f"{attention(m, 1, t) / GB:.1f}" for t in (1024, 2048, 4096))
        lf, ll = linear_full(m), linear_lora(m, r, tg)
        print(f"| {arch(m)} | {p:,} ({params_b(p)}) | {na:,} ({na / 1e6:.1f} M) | "
              f"{g(2 * p)} + {g(16 * na)} GB | {g(6 * na)} GB | {kv_per_token(m) // KIB} KiB | "
              f"{att} GB | {lf / MB:.1f} + {ll / MB:.1f} = {(lf + ll) / MB:.1f} MB | "
              f"{g(2 * targeted_params(m, tg))} GB |")

    print(f"\nPeak per step, one micro-batch row of T tokens (micro_batch_tokens = T), "
          f"{conc} episodes of T tokens in the engine (kv_cache_tokens = {conc} x T); "
          f"fits = at most {100 - round(100 * MARGIN)} % of the card:\n")
    heads = [f"{c} T = {t:,}" for c, _ in CARDS for t in (1024, 2048, 4096)]
    print("| model | " + " | ".join(heads) + " | largest T that fits (multiple of 256): "
          + " / ".join(c for c, _ in CARDS) + " |")
    print("|---|" + "---|" * (len(heads) + 1))
    for m in MODELS:
        cells = []
        for _, cap in CARDS:
            for t in (1024, 2048, 4096):
                b = total(m, r, tg, t, 1, conc * t)
                cells.append(f"{g(b)} GB {'fits' if fits(b, cap) else 'no'}")
        best = []
        for _, cap in CARDS:
            ok = [t for t in range(256, 16385, 256) if fits(total(m, r, tg, t, 1, conc * t), cap)]
            best.append(f"{max(ok):,}" if ok else "none")
        print(f"| {m['name']} | " + " | ".join(cells) + " | " + " / ".join(best) + " |")

    print("\nThe configs (one row of T = max_context_tokens = micro_batch_tokens; "
          "kv_cache_tokens = rollout_max_concurrency x T):\n")
    for f, name, card, t, c in CONFIGS:
        m, cap = by_name[name], dict(CARDS)[card]
        ps = parts(m, r, tg, t, 1, c * t)
        tot = sum(v for _, v in ps)
        merged = tot + 2 * targeted_params(m, tg)
        terms = " + ".join(f"{k} {g(v)}" for k, v in ps)
        print(f"- `configs/{f}` ({name}, {card}, T = {t:,}, {c} episodes, KV {c * t:,} positions): "
              f"{terms} = **{g(tot)} GB** <= {g((1 - MARGIN) * cap)} GB "
              f"({'fits' if fits(tot, cap) else 'DOES NOT FIT'}); "
              f"merged serving: {g(merged)} GB ({'fits' if fits(merged, cap) else 'does not fit'}).")
    m = by_name["Qwen3-32B"]
    for card, cap in CARDS:
        ok = [t for t in range(256, 16385, 256) if fits(total(m, r, tg, t, 1, 8 * t), cap)]
        line = (f"- Qwen3-32B, {card}, 8 episodes: T = 1,024 needs "
                f"{g(total(m, r, tg, 1024, 1, 8 * 1024))} GB (attention {g(attention(m, 1, 1024))} GB); ")
        if ok:
            t = max(ok)
            line += f"the largest T that fits is {t:,} ({g(total(m, r, tg, t, 1, 8 * t))} GB)."
        else:
            static = sum(v for k, v in parts(m, r, tg, 0, 1, 0))
            line += (f"no T fits: the weights, adapter state and logits alone are {g(static)} GB "
                     f"of {g((1 - MARGIN) * cap)} GB.")
        print(line)

if __name__ == "__main__":
    main()
