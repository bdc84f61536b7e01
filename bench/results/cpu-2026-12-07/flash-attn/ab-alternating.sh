#!/bin/bash
# A/B with alternating order: the last landed commit (236b997) vs this tree, bench-small train
# phase, f32 (the CPU kernels: unchanged paths) and bf16 (the candle backend: the log-prob head
# now runs its CPU twin instead of candle's log-softmax chain).
cd /work/main
OUT=bench/results/cpu-2026-12-07/flash-attn
PREV=/tmp/basetarget/release/mtrl
NEW=target/release/mtrl
: > $OUT/ab-alternating.jsonl
for dtype in f32 bf16; do
  for i in 1 2 3 4; do
    if [ $((i % 2)) = 1 ]; then order="prev new"; else order="new prev"; fi
    for b in $order; do
      bin=$PREV; [ $b = new ] && bin=$NEW
      echo -n "{\"binary\":\"$b\",\"dtype\":\"$dtype\",\"run\":$i,\"report\":" >> $OUT/ab-alternating.jsonl
      $bin bench model --config bench/bench-small.json --dtype $dtype --phases train --repeats 5 --no-optimizer | tr -d '\n' >> $OUT/ab-alternating.jsonl
      echo "}" >> $OUT/ab-alternating.jsonl
    done
  done
done
echo done
