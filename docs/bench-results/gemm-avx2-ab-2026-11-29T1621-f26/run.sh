#!/bin/bash
# AVX2 level (SPARQ_CPU=avx2) prefill, the GEMM tile change against its parent, interleaved;
# llama.cpp built for AVX2 only at the start and the end of the run.
set -u
O=${O:-/tmp/s13/ab/out}
mkdir -p $O
M=/tmp/sparq-bench-models/llama-3.2-1b-q8_0-scaled.gguf
BASE=/tmp/s13/base/build/sparq   # 9797424 (parent)
NEW=/tmp/s13/sparq-c7bbeeb       # c7bbeeb
LB=/tmp/llama.cpp/build-avx2/bin/llama-bench
lscpu > $O/lscpu.txt
{ echo "date: $(date -u +%FT%TZ)"; echo "base: $($BASE --version 2>&1 | head -1)"; echo "new: $($NEW --version 2>&1 | head -1)";
  echo "llama-bench: $LB"; grep -E "GGML_(AVX|AVX2|AVX512|AVX_VNNI|FMA|F16C|NATIVE|BMI2):|CMAKE_BUILD_TYPE:|BUILD_SHARED" /tmp/llama.cpp/build-avx2/CMakeCache.txt;
  echo "load: $(cat /proc/loadavg)"; } > $O/machine.txt
echo "$LB -m $M -p 512 -n 0 -t 2 -r 3 -fa 0,1 -o json" > $O/commands.txt
echo "SPARQ_CPU=avx2 BIN bench prefill -m $M -p 512 -t 2 -r 3 --json   (BIN = base, new; 5 interleaved rounds)" >> $O/commands.txt
$LB -m $M -p 512 -n 0 -t 2 -r 3 -fa 0,1 -o json > $O/llama-1.json 2> $O/llama-1.log
for r in 1 2 3 4 5; do
  for who in base new; do
    b=$BASE; [ $who = new ] && b=$NEW
    SPARQ_CPU=avx2 $b bench prefill -m $M -p 512 -t 2 -r 3 --json > $O/r$r-$who.json 2> $O/r$r-$who.log
  done
done
$LB -m $M -p 512 -n 0 -t 2 -r 3 -fa 0,1 -o json > $O/llama-2.json 2> $O/llama-2.log
echo "end: $(date -u +%FT%TZ) load $(cat /proc/loadavg)" >> $O/machine.txt
# one pp4096 pass of each, after the pp512 rounds
echo "$LB -m $M -p 4096 -n 0 -t 2 -r 2 -fa 0,1 -o json; SPARQ_CPU=avx2 BIN bench prefill -m $M -p 4096 -t 2 -r 2 --json (base, new)" >> $O/commands.txt
for who in base new; do
  b=$BASE; [ $who = new ] && b=$NEW
  SPARQ_CPU=avx2 $b bench prefill -m $M -p 4096 -t 2 -r 2 --json > $O/pp4096-$who.json 2> $O/pp4096-$who.log
done
$LB -m $M -p 4096 -n 0 -t 2 -r 2 -fa 0,1 -o json > $O/llama-pp4096.json 2> $O/llama-pp4096.log
echo "end4096: $(date -u +%FT%TZ) load $(cat /proc/loadavg)" >> $O/machine.txt
