#!/bin/bash
# Same-run CPU comparison: previous commit (3555f55) vs this tree, bench-small f32, then the
# checkpointing / ragged figures of this tree. Raw JSON lines, one per run.
set -e
cd /work/main
OUT=bench/results/cpu-2026-12-07/packing
PREV=/tmp/prevtarget/release/mtrl
NEW=target/release/mtrl
: > $OUT/ab.jsonl
for i in 1 2 3 4; do
  for b in prev new; do
    bin=$PREV; [ $b = new ] && bin=$NEW
    echo -n "{\"binary\":\"$b\",\"run\":$i,\"report\":" >> $OUT/ab.jsonl
    $bin bench model --config bench/bench-small.json --phases train --repeats 3 | tr -d '\n' >> $OUT/ab.jsonl
    echo "}" >> $OUT/ab.jsonl
  done
done
: > $OUT/checkpointing.jsonl
for i in 1 2; do
for args in "--train-len 2048 --train-batch 2" "--train-len 2048 --train-batch 2 --checkpointing" "" "--checkpointing" "--train-ragged" "--train-ragged --checkpointing"; do
  echo -n "{\"args\":\"$args\",\"run\":$i,\"report\":" >> $OUT/checkpointing.jsonl
  $NEW bench model --config bench/bench-small.json --phases train --repeats 2 --no-optimizer $args | tr -d '\n' >> $OUT/checkpointing.jsonl
  echo "}" >> $OUT/checkpointing.jsonl
done
done
echo done
