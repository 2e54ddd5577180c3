#!/bin/bash
# abenv.sh OUTDIR PAIRS BIN "ENV1" "ENV2" ... : one binary under several environments, in turn
out=$1; pairs=$2; bin=$3; shift 3; mkdir -p $out
M=/tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf
for i in $(seq 1 $pairs); do for e in "$@"; do
  n=$(echo "$e" | tr ' =,' '_+.')
  env $e $bin bench decode -m $M -np 16 --depth ${DEPTH:-16384} --attn dense,sparq --sparq-ratio 1/8 --fill random -n 16 --rounds 2 -t 2 --json > $out/$n-$i.json 2> $out/$n-$i.log
  echo "$n $i: $(grep 'round' $out/$n-$i.log | sed 's/.*depth=\([0-9]*\) round/\1 r/' | tr '\n' ' ')" >> $out/summary.txt
done; done
echo done >> $out/summary.txt
