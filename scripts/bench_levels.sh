#!/usr/bin/env bash
# bench_levels.sh - sparq at each SIMD level of one portable build (ref,
# avx2, avx512 through SPARQ_CPU) beside llama.cpp's llama-bench built for
# AVX2 only, on the same GGUF files and threads; then the portable build's
# avx512 level against a -march=native build of the same commit, interleaved.
#
#   LLAMA_BENCH=/path/to/avx2/llama-bench NATIVE=/path/to/native/sparq \
#     scripts/bench_levels.sh --out docs/bench-results/levels-DATE
#
# LLAMA_BENCH must be a build without AVX-512 (cmake -DGGML_NATIVE=OFF
# -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF): the point is
# what a user of an AVX2-only CPU gets from each engine. NATIVE (optional) is
# build/sparq of the same commit built with `make ARCH=-march=native`.
# MODELS_DIR (default /tmp/sparq-bench-models) holds the generated files
# (`gen-model --init scaled`, written when missing). THREADS (default: all
# cores), REPS (default 3), ROUNDS (native A/B pairs, default 7), PEER_ROUNDS
# (interleaved rounds of sparq avx2 and llama.cpp prefill, default 5); SMOL_MODEL,
# L1B_MODEL, DEPTH (default 32768) and PROMPTS (default "512 4096") replace
# the files, the depth and the prompt lengths for a quick check of the script;
# STEPS=NAME,NAME,... runs only those steps (the names in commands.txt).
# Takes about an hour on 2 cores, most of it llama-bench's prefill to 32k,
# and ~4 minutes more per peer round.
# Run it on a quiet machine: nothing else may use the cores.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench_model.sh

OUT=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "bench_levels: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-7}
PEER_ROUNDS=${PEER_ROUNDS:-5}
MODELS_DIR=${MODELS_DIR:-/tmp/sparq-bench-models}
LLAMA_BENCH=${LLAMA_BENCH:-}
NATIVE=${NATIVE:-}
SPARQ=${SPARQ:-build/sparq}
[ -n "$OUT" ] || { echo "bench_levels: --out DIR is required" >&2; exit 2; }
[ -x "$SPARQ" ] || { echo "bench_levels: $SPARQ not built (make)" >&2; exit 1; }
for b in "$LLAMA_BENCH" "$NATIVE"; do
  [ -z "$b" ] || [ -x "$b" ] || { echo "bench_levels: $b is not executable" >&2; exit 1; }
done
mkdir -p "$OUT" "$MODELS_DIR"
CMDS=$OUT/commands.txt
: > "$CMDS"
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/log.txt" >&2; }

model() { bench_model "$MODELS_DIR" "$1" Q8_0 scaled; } # model SHAPE -> Q8_0 file, trained-scale weights

# step NAME CMD...: stdout to NAME.json, stderr to the log; the command, the
# load average at its start and its wall time go to commands.txt.
step() {
  local name=$1; shift
  local t0 load
  case ",${STEPS:-$name}," in *",$name,"*) ;; *) return 0 ;; esac
  t0=$(date +%s); load=$(cut -d' ' -f1 /proc/loadavg)
  log "$name"
  "$@" > "$OUT/$name.json" 2>>"$OUT/log.txt"
  echo "$name [load $load, $(( $(date +%s) - t0 )) s]: $*" >> "$CMDS"
}
level() { local lv=$1; shift; env SPARQ_CPU="$lv" "$@"; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "sparq: $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty) ($SPARQ)"
  echo "sparq --version: $("$SPARQ" --version 2>&1 | tr '\n' ' ')"
  [ -z "$NATIVE" ] || echo "native: $NATIVE ($("$NATIVE" --version 2>&1 | tr '\n' ' '))"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
  echo "threads: $THREADS  reps: $REPS  rounds: $ROUNDS  peer rounds: $PEER_ROUNDS"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ -n "$LLAMA_BENCH" ]; then
    echo "llama_bench: $LLAMA_BENCH"
    echo "llama_build: $(git -C "$(dirname "$LLAMA_BENCH")/../.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
    cache=$(dirname "$LLAMA_BENCH")/../CMakeCache.txt
    [ -f "$cache" ] && grep -E '^(CMAKE_BUILD_TYPE|GGML_[A-Z0-9_]+|BUILD_SHARED_LIBS):' "$cache" \
      | grep -E 'BUILD_TYPE|NATIVE|AVX|FMA|F16C|BMI2|AMX|SHARED' | sed 's/^/  /'
  fi
} > "$OUT/machine.txt"
lscpu > "$OUT/lscpu.txt"
cat "$OUT/machine.txt" >&2

smol=${SMOL_MODEL:-$(model smollm2-135m)}
l1b=${L1B_MODEL:-$(model llama-3.2-1b)}
DEPTH=${DEPTH:-32768}
step membw "$SPARQ" bench membw --size 1024 -t 1,"$THREADS" --reps 5 --json

# Decode at depth: smollm2-135m at 0 and 32768, dense and SparQ 1/8.
for lv in avx2 avx512 ref; do
  step "decode-smol-$lv" level $lv "$SPARQ" bench decode -m "$smol" --depth 0,$DEPTH --attn dense,sparq \
    --sparq-ratio 1/8 --fill random -n 32 -t "$THREADS" --json
done
[ -z "$LLAMA_BENCH" ] || step llama-decode-smol "$LLAMA_BENCH" -m "$smol" -p 0 -n 32 -d 0,$DEPTH \
  -fa 0,1 -t "$THREADS" -r "$REPS" -o json

# Depth-0 decode of llama-3.2-1b: the weight matmuls.
for lv in avx2 avx512 ref; do
  n=32; [ $lv = ref ] && n=8   # the plain-C matmuls take seconds per token
  step "decode-l1b-$lv" level $lv "$SPARQ" bench decode -m "$l1b" --depth 0 --attn dense -n $n \
    -t "$THREADS" --json
done
[ -z "$LLAMA_BENCH" ] || step llama-decode-l1b "$LLAMA_BENCH" -m "$l1b" -p 0 -n 32 -fa 0,1 \
  -t "$THREADS" -r "$REPS" -o json

# Prefill of llama-3.2-1b; the reference level only on smollm2 (its plain-C
# GEMM would take many minutes on the 1B model).
for n in ${PROMPTS:-512 4096}; do
  for lv in avx2 avx512; do
    step "prefill-l1b-$n-$lv" level $lv "$SPARQ" bench prefill -m "$l1b" -p $n -t "$THREADS" \
      -r "$REPS" --json
  done
done
prompts=$(echo ${PROMPTS:-512 4096} | tr ' ' ,)
[ -z "$LLAMA_BENCH" ] || step llama-prefill-l1b "$LLAMA_BENCH" -m "$l1b" -p "$prompts" -n 0 -fa 0,1 \
  -t "$THREADS" -r "$REPS" -o json
# The same prefill ratio in interleaved rounds: one repetition of each
# engine after the other, so the guest's drift over minutes (6% between
# runs half an hour apart, as much as a target's margin) reaches both
# alike; the summary takes each round's ratio and their median.
if [ -n "$LLAMA_BENCH" ]; then
  for i in $(seq "$PEER_ROUNDS"); do
    step "peer-$i-sparq" level avx2 "$SPARQ" bench prefill -m "$l1b" -p "$prompts" -t "$THREADS" -r 1 --json
    step "peer-$i-llama" "$LLAMA_BENCH" -m "$l1b" -p "$prompts" -n 0 -fa 0,1 -t "$THREADS" -r 1 -o json
  done
fi
for lv in avx2 avx512; do
  step "prefill-smol-512-$lv" level $lv "$SPARQ" bench prefill -m "$smol" -p 512 -t "$THREADS" \
    -r "$REPS" --json
done
# the plain-C GEMM runs at a few tokens/s: one 512-token prompt, no warm-up
step prefill-smol-512-ref level ref "$SPARQ" bench prefill -m "$smol" -p "${REF_PROMPT:-512}" -t "$THREADS" -r 1 \
  --warmup 0 --json

# The cost of run-time dispatch: the portable build at avx512 against the
# native build, interleaved so drift hits both alike.
if [ -n "$NATIVE" ]; then
  for i in $(seq "$ROUNDS"); do
    for who in portable native; do
      bin=$SPARQ; [ $who = native ] && bin=$NATIVE
      step "ab-$i-$who-decode" level avx512 "$bin" bench decode -m "$smol" --depth 0 --attn dense \
        -n 64 -t "$THREADS" --json
      step "ab-$i-$who-prefill" level avx512 "$bin" bench prefill -m "$l1b" -p 512 -t "$THREADS" \
        -r 1 --json
    done
  done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
/usr/bin/python3 scripts/bench_levels_summary.py "$OUT" | tee "$OUT/summary.md"
log "done: $OUT"
