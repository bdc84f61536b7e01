#!/bin/bash
# A/B with alternating order: the last landed commit (cb956f9) vs this tree (fb3fdd5), release
# builds, bench/bench-small.json, f32 (the CPU kernels) — `mtrl bench model` (prefill, decode,
# train) and `mtrl bench engine` (the multi-turn workload; the engine's forward now routes through
# `engine_attention`, "auto" = gathered on the CPU).
cd /work/main
OUT=bench/results/cpu-2026-12-08
PREV=target/prevrel/release/mtrl
NEW=target/release/mtrl
: > $OUT/ab-alternating.jsonl
for bench in model engine; do
  for i in 1 2; do
    if [ $((i % 2)) = 1 ]; then order="prev new"; else order="new prev"; fi
    for b in $order; do
      bin=$PREV; [ $b = new ] && bin=$NEW
      echo -n "{\"binary\":\"$b\",\"bench\":\"$bench\",\"run\":$i,\"report\":" >> $OUT/ab-alternating.jsonl
      if [ $bench = model ]; then
        $bin bench model --config bench/bench-small.json --repeats 2 --no-optimizer | tr -d '\n' >> $OUT/ab-alternating.jsonl
      else
        $bin bench engine --config bench/bench-small.json --repeats 1 | tr -d '\n' >> $OUT/ab-alternating.jsonl
      fi
      echo "}" >> $OUT/ab-alternating.jsonl
    done
  done
done
echo done
