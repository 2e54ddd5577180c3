#!/bin/bash
# pipe_ab.sh OUT PAIRS: same binary, SPARQ_PIPE=0 then 1, interleaved; 16 sequences, depth $DEPTH
out=$1; pairs=$2; mkdir -p $out
M=/tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf
for i in $(seq 1 $pairs); do for e in ${MODES:-0 1}; do
  SPARQ_PIPE=$e /tmp/s12/sparq-pipe bench decode -m $M -np 16 --depth ${DEPTH:-16384} --attn dense,sparq --sparq-ratio 1/8 --fill random -n 16 --rounds 2 -t 2 --json > $out/pipe$e-$i.json 2> $out/pipe$e-$i.log
  echo "pipe$e $i: $(grep 'round' $out/pipe$e-$i.log | grep -v 'depth=0' | sed 's/.*round/round/' | tr '\n' ' ')" >> $out/summary.txt
done; done
echo done >> $out/summary.txt
