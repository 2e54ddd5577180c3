#!/bin/bash
cd /work/main
out=$out
for i in 1 2 3; do for b in sparq-base sparq-head; do
  SPARQ_BIN=/tmp/exp/$b scripts/bench_serve.sh --no-shared --init scaled --results $out/$b-$i > $out/$b-$i.log 2>&1
done; done
echo done > $out/done
