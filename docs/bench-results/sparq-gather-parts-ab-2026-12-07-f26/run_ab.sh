#!/bin/sh
# Interleaved A/B of the SparQ staged-gather commit: base (e909554) vs new (5dc9c71)
OUT=/tmp/ab/res
S=/tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf
L=/tmp/sparq-bench-models/llama-3.2-1b-q8_0-scaled.gguf
for round in 1 2 3 4 5; do
  for b in base new; do
    bin=/tmp/ab/new-sparq; [ $b = base ] && bin=/tmp/ab/base/build/sparq
    echo "round $round $b start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    $bin bench decode -m $S --depth 32k --attn sparq --sparq-ratio 1/8 --fill random -n 32 -t 2 --json > $OUT/smol32k-t2-$b-r$round.json 2>> $OUT/stderr.txt
    $bin bench decode -m $S --depth 32k --attn sparq --sparq-ratio 1/8 --fill random -n 32 -t 1 --json > $OUT/smol32k-t1-$b-r$round.json 2>> $OUT/stderr.txt
    $bin bench decode -m $L --depth 16k --attn sparq --sparq-ratio 1/8 --fill random -n 32 -t 2 --json > $OUT/l1b16k-t2-$b-r$round.json 2>> $OUT/stderr.txt
    $bin bench decode -m $S -np 16 --depth 16384 --attn sparq --sparq-ratio 1/8 --fill random -n 16 -t 2 --json > $OUT/smol16k-np16-$b-r$round.json 2>> $OUT/stderr.txt
  done
done
echo "done $(date -u +%H:%M:%S)" >> $OUT/log.txt
