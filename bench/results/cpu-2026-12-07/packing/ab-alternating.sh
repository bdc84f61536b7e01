#!/bin/bash
# A/B with alternating order: previous commit (3555f55) vs this tree, bench-small f32 train phase.
cd /work/main
OUT=bench/results/cpu-2026-12-07/packing
PREV=/tmp/prevtarget/release/mtrl
NEW=target/release/mtrl
: > $OUT/ab-alternating.jsonl
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="prev new"; else order="new prev"; fi
  for b in $order; do
    bin=$PREV; [ $b = new ] && bin=$NEW
    echo -n "{\"binary\":\"$b\",\"run\":$i,\"report\":" >> $OUT/ab-alternating.jsonl
    $bin bench model --config bench/bench-small.json --phases train --repeats 5 --no-optimizer | tr -d '\n' >> $OUT/ab-alternating.jsonl
    echo "}" >> $OUT/ab-alternating.jsonl
  done
done
echo done
