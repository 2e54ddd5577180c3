#!/bin/bash
cd /work/main
for i in 1 2; do for b in sparq-base sparq-cc3e489; do
  SPARQ_BIN=/tmp/exp/$b scripts/bench_serve.sh --no-shared --init scaled --results /tmp/s10/serve-ab/$b-$i > /tmp/s10/serve-ab/$b-$i.log 2>&1
done; done
echo done > /tmp/s10/serve-ab/done
