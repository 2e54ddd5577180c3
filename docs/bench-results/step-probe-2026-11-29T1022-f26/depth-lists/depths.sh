#!/bin/bash
# depths.sh OUT PAIRS BIN: the 16x16k step with depth list "4096,16384" vs "16384" alone, alternating
out=$1; pairs=$2; bin=$3; mkdir -p $out
M=/tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf
for i in $(seq 1 $pairs); do for dl in 4096,16384 16384; do
  $bin bench decode -m $M -np 16 --depth $dl --attn dense,sparq --sparq-ratio 1/8 --fill random -n 16 --rounds 3 -t 2 --json > $out/d$dl-$i.json 2> $out/d$dl-$i.log
  echo "$dl $i: $(grep 'depth=16384 round' $out/d$dl-$i.log | sed 's/.*round/round/' | tr '\n' ' ')" >> $out/summary.txt
done; done
echo done >> $out/summary.txt
