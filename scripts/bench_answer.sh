#!/usr/bin/env bash
# bench_answer.sh - "time to answer": one long document in, one answer out.
# A prompt of N tokens (default 16384) then G generated tokens (default 128),
# wall time of prefill + decode, for sparq dense and SparQ 1/8 beside
# llama.cpp on the same GGUF file:
#
#   sparq:     sparq run -f PROMPT -n G --temp 0 --ignore-eos --json
#              (its prefill_ms + decode_ms; the prompt is text whose token
#              count is printed and must equal N)
#   llama.cpp: llama-bench -pg N,G --no-warmup (a prefill of N random
#              tokens then G generated, timed as one test; sparq run has no
#              warm-up either), best of -fa 0 and -fa 1
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench_answer.sh --out docs/bench-results/answer-DATE
#
# Options: --out DIR (raw JSON, log, summary.md; default a temp dir),
# --model FILE (default MODELS_DIR/llama-3.2-1b-q8_0.gguf, generated if
# missing; with --init scaled llama-3.2-1b-q8_0-scaled.gguf, weights at a trained model's
# scales), --prompt N, --gen G, --reps R (default 1: a 16k prefill of a 1B
# model takes minutes). Run it on a quiet machine.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench_model.sh

OUT=""; N=16384; G=128; REPS=1; MODEL=""; INIT=plain
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --prompt) N=$2; shift ;;
    --gen) G=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --init) INIT=$2; shift
            bench_init_ok "$INIT" || { echo "bench_answer: --init takes plain or scaled (got '$INIT')" >&2; exit 2; } ;;
    *) echo "bench_answer: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case "$N$G$REPS" in *[!0-9]*) echo "bench_answer: --prompt, --gen and --reps take positive integers" >&2; exit 2 ;; esac
THREADS=${THREADS:-$(nproc)}
MODELS_DIR=${MODELS_DIR:-/tmp/sparq-bench-models}
OUT=${OUT:-$(mktemp -d /tmp/sparq-bench-answer-XXXXXX)}
LLAMA_BENCH=${LLAMA_BENCH:-}
SPARQ=build/sparq
mkdir -p "$OUT" "$MODELS_DIR"
[ -x "$SPARQ" ] || { echo "bench_answer: $SPARQ not built (make)" >&2; exit 1; }
if [ -n "$LLAMA_BENCH" ] && [ ! -x "$LLAMA_BENCH" ]; then
  echo "bench_answer: LLAMA_BENCH=$LLAMA_BENCH is not executable" >&2; exit 1
fi
if [ -z "$MODEL" ]; then
  MODEL=$(bench_model "$MODELS_DIR" llama-3.2-1b Q8_0 "$INIT")
fi
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt" >&2; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "sparq: $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
  echo "cpu_id: $(bench_cpu_id) (family/model/stepping)"
  echo "model: $MODEL"
  echo "prompt: $N tokens, generated: $G, threads: $THREADS, reps: $REPS"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  [ -n "$LLAMA_BENCH" ] && echo "llama_bench: $LLAMA_BENCH"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# A text prompt of exactly N tokens: "hello world " repeated tokenizes the
# same way each time, so two short runs give tokens per repeat and the
# offset (BOS, the first word); the remainder is padded with single-token
# words measured the same way.
ntok() { # TEXT -> prompt tokens
  printf '%s' "$1" > "$OUT/probe.txt"
  "$SPARQ" run -m "$MODEL" -f "$OUT/probe.txt" -n 0 -t "$THREADS" --json 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["prompt_tokens"]))'
}
rep() { python3 -c 'import sys; print(sys.argv[1] * int(sys.argv[2]), end="")' "$1" "$2"; }
a=$(ntok "$(rep 'hello world ' 20)"); b=$(ntok "$(rep 'hello world ' 40)")
per=$(( (b - a) / 20 )); off=$(( a - 20 * per ))
[ "$per" -gt 0 ] || { echo "bench_answer: cannot calibrate the prompt ($a, $b tokens)" >&2; exit 1; }
reps_text=$(( (N - off) / per ))
text="$(rep 'hello world ' "$reps_text")"
short=$(( N - off - reps_text * per ))
text="$text$(rep 'a ' "$short")"
printf '%s' "$text" > "$OUT/prompt.txt"
got=$(ntok "$text")
rm -f "$OUT/probe.txt"
log "prompt: $got tokens (wanted $N)"
[ "$got" = "$N" ] || echo "bench_answer: warning: the prompt has $got tokens, not $N" | tee -a "$OUT/log.txt" >&2

CTX=$(( N + G + 64 ))
for r in $(seq 1 "$REPS"); do
  for pol in dense sparq; do
    args="--attn dense"; [ $pol = sparq ] && args="--attn sparq --sparq-ratio 1/8"
    log "sparq $pol (rep $r): run -f prompt.txt -n $G -c $CTX $args"
    # shellcheck disable=SC2086
    "$SPARQ" run -m "$MODEL" -f "$OUT/prompt.txt" -n "$G" -c "$CTX" -t "$THREADS" --temp 0 --ignore-eos $args --json \
      > "$OUT/sparq-$pol-$r.json" 2>>"$OUT/log.txt"
  done
  if [ -n "$LLAMA_BENCH" ]; then
    log "llama-bench -pg $N,$G (rep $r)"
    "$LLAMA_BENCH" -m "$MODEL" -p 0 -n 0 -pg "$N,$G" -fa 0,1 -t "$THREADS" -r 1 --no-warmup -o json \
      > "$OUT/llama-$r.json" 2>>"$OUT/log.txt"
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

python3 - "$OUT" "$N" "$G" <<'PY' | tee "$OUT/summary.md"
import glob, json, os, statistics, sys
out, N, G = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(p):
    try:
        with open(p) as f: return json.load(f)
    except Exception: return None
def runs(pol):
    r = []
    for f in sorted(glob.glob(os.path.join(out, "sparq-%s-*.json" % pol))):
        j = load(f)
        if j and len(j.get("tokens", [])) == G:
            r.append((j["prefill_ms"] / 1e3, j["decode_ms"] / 1e3, len(j["prompt_tokens"])))
    return r
ll = []
for f in sorted(glob.glob(os.path.join(out, "llama-*.json"))):
    rows = [x for x in (load(f) or []) if x.get("n_prompt") == N and x.get("n_gen") == G]
    if rows:
        best = max(rows, key=lambda x: x["avg_ts"])
        ll.append(((N + G) / best["avg_ts"], best.get("flash_attn", best.get("fa", "?"))))
l_med = statistics.median(t for t, _ in ll) if ll else None
print("Prompt of %d tokens, %d generated; wall seconds (median of the reps)\n" % (N, G))
print("| engine | prefill s | decode s | time to answer s | vs llama.cpp |")
print("|---|---|---|---|---|")
for pol, name in (("dense", "sparq dense"), ("sparq", "sparq SparQ 1/8")):
    r = runs(pol)
    if not r:
        print("| %s | not measured | | | |" % name); continue
    p = statistics.median(x[0] for x in r); d = statistics.median(x[1] for x in r)
    t = statistics.median(x[0] + x[1] for x in r)
    ratio = "%.2fx sooner" % (l_med / t) if l_med else "-"
    print("| %s (%d prompt tokens) | %.1f | %.1f | %.1f | %s |" % (name, r[0][2], p, d, t, ratio))
if ll:
    print("| llama.cpp llama-bench -pg %d,%d (best -fa: %s) | | | %.1f | 1.00x |" % (N, G, ll[0][1], l_med))
else:
    print("| llama.cpp | not measured (LLAMA_BENCH unset) | | | |")
PY
log "done: $OUT"
