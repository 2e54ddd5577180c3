#!/bin/bash
# main runs of c4359bd on the family-26 guest: the step alone, then serving x3
cd /work/main
O=/tmp/s12/main
lscpu > $O/lscpu.txt
git rev-parse HEAD > $O/sparq-commit.txt
echo "./build/sparq bench decode -m /tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf -np 1,4,16 --depth 4096,16384 --attn dense,sparq --sparq-ratio 1/8 --fill random -n 16 --rounds 3 -t 2 --json > step.json 2> step.log  # started $(date -u +%FT%TZ), load $(cat /proc/loadavg)" > $O/command.txt
./build/sparq bench decode -m /tmp/sparq-bench-models/smollm2-135m-q8_0-scaled.gguf -np 1,4,16 --depth 4096,16384 --attn dense,sparq --sparq-ratio 1/8 --fill random -n 16 --rounds 3 -t 2 --json > $O/step.json 2> $O/step.log
echo "step done $(date -u +%FT%TZ)" >> $O/progress
for r in 1 2 3; do
  echo "serve run $r start $(date -u +%FT%TZ) load $(cat /proc/loadavg)" >> $O/progress
  LLAMA_SERVER=/tmp/llama.cpp/build/bin/llama-server scripts/bench_serve.sh --no-shared --init scaled --results $O/run-$r > $O/run-$r.log 2>&1
done
echo "done $(date -u +%FT%TZ)" >> $O/progress
