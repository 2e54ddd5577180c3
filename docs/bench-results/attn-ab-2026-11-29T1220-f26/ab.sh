#!/bin/bash
# ab.sh OUTDIR PAIRS BIN... : runs each binary in turn PAIRS times (16x16k step, rounds 2)
out=$1; pairs=$2; shift 2; mkdir -p $out
M=/tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf
for i in $(seq 1 $pairs); do for b in "$@"; do
  n=$(basename $b)
  $b bench decode -m $M -np 16 --depth ${DEPTH:-16384} --attn dense,sparq --sparq-ratio 1/8 --fill random -n 16 --rounds 2 -t 2 --json > $out/$n-$i.json 2> $out/$n-$i.log
  echo "$n $i: $(grep 'round' $out/$n-$i.log | grep -v 'depth=0' | sed 's/.*round/round/' | tr '\n' ' ')" >> $out/summary.txt
done; done
echo done >> $out/summary.txt
