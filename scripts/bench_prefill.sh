#!/usr/bin/env bash
# bench_prefill.sh - prefill (prompt processing) speed of sparq beside
# llama.cpp's llama-bench: the same GGUF files (random weights of real shapes,
# written by `sparq gen-model`), the same threads, each point run by sparq and
# then by llama-bench (best of -fa 0 and -fa 1) before the next point, so slow
# drift of the machine hits both alike.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench_prefill.sh --out docs/bench-results/prefill-DATE
#
# Options: --quick (smollm2 pp512 only, 2 reps), --long (adds llama-3.2-1b
# Q8_0 pp16384, one rep each: ~20 minutes, most of it llama-bench's), --out DIR (raw JSON, logs and
# summary.md; default a temp dir), --init plain|scaled (gen-model's weights; scaled: a trained
# model's scales, no subnormal operand in either engine; files <shape>-<type>-scaled.gguf). THREADS (default: all cores), REPS
# (default 3), MODELS_DIR (default /tmp/sparq-bench-models: the generated
# files are kept for the next run).
# Run it on a quiet machine: nothing else may use the cores.
set -eu
cd "$(dirname "$0")/.."
. scripts/bench_model.sh

QUICK=0; LONG=0; OUT=""; INIT=plain
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --long) LONG=1 ;;
    --out) OUT=$2; shift ;;
    --init) INIT=$2; shift
            bench_init_ok "$INIT" || { echo "bench_prefill: --init takes plain or scaled (got '$INIT')" >&2; exit 2; } ;;
    *) echo "bench_prefill: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
[ $QUICK = 1 ] && REPS=2
MODELS_DIR=${MODELS_DIR:-/tmp/sparq-bench-models}
OUT=${OUT:-$(mktemp -d /tmp/sparq-bench-prefill-XXXXXX)}
LLAMA_BENCH=${LLAMA_BENCH:-}
SPARQ=build/sparq
mkdir -p "$OUT" "$MODELS_DIR"
[ -x "$SPARQ" ] || { echo "bench_prefill: $SPARQ not built (make)" >&2; exit 1; }
if [ -n "$LLAMA_BENCH" ] && [ ! -x "$LLAMA_BENCH" ]; then
  echo "bench_prefill: LLAMA_BENCH=$LLAMA_BENCH is not executable" >&2; exit 1
fi
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt" >&2; }

model() { bench_model "$MODELS_DIR" "$1" "$2" "$INIT"; } # model SHAPE TYPE -> path

{
  echo "date: $(date -u +%FT%TZ)"
  echo "sparq: $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
  echo "cpu_id: $(bench_cpu_id) (family/model/stepping)"
  echo "threads: $THREADS  reps: $REPS  weights: gen-model --init $INIT"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ -n "$LLAMA_BENCH" ]; then
    echo "llama_bench: $LLAMA_BENCH"
    echo "llama_build: $(git -C "$(dirname "$LLAMA_BENCH")/../.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
  fi
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

points=("smollm2-135m Q8_0 512")
if [ $QUICK = 0 ]; then
  points+=("smollm2-135m Q8_0 4096" "llama-3.2-1b Q8_0 512" "llama-3.2-1b Q8_0 4096" "llama-3.2-1b Q4_K_M 512"
           "llama-3.2-1b Q4_K_M 4096")
  [ $LONG = 1 ] && points+=("llama-3.2-1b Q8_0 16384")
fi

"$SPARQ" bench peak -t "1,$THREADS" --json > "$OUT/peak.json" 2>>"$OUT/log.txt"
for p in "${points[@]}"; do
  set -- $p
  shape=$1; type=$2; n=$3
  m=$(model "$shape" "$type")
  # 16k: one rep and no warm-up run on either side (a 1B model's 16k
  # prefill takes minutes; llama-bench's warm-up would repeat it per -fa)
  reps=$REPS; sw=(); lw=(); [ "$n" -ge 16384 ] && { reps=1; sw=(--warmup 0); lw=(--no-warmup); }
  tag="$shape-$type-pp$n"
  log "sparq $tag"
  "$SPARQ" bench prefill -m "$m" -p "$n" -t "$THREADS" -r "$reps" "${sw[@]}" --json > "$OUT/sparq-$tag.json" 2>>"$OUT/log.txt"
  if [ -n "$LLAMA_BENCH" ]; then
    log "llama-bench $tag"
    "$LLAMA_BENCH" -m "$m" -p "$n" -n 0 -fa 0,1 -t "$THREADS" -r "$reps" "${lw[@]}" -o json > "$OUT/llama-$tag.json" 2>>"$OUT/log.txt"
  fi
done
# threads scaling: the smallest model at 1 thread too
m=$(model smollm2-135m Q8_0)
log "sparq smollm2 pp512 at 1 thread"
"$SPARQ" bench prefill -m "$m" -p 512 -t 1 -r "$REPS" --json > "$OUT/sparq-threads1.json" 2>>"$OUT/log.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, sys, glob
out = sys.argv[1]
def load(p):
    try:
        with open(p) as f: return json.load(f)
    except Exception: return None
peak = load(os.path.join(out, "peak.json")) or []
print("| model | prompt | sparq tok/s (median, min..max) | llama.cpp tok/s (best -fa, mean ± sd) | sparq / llama.cpp | sparq GFLOP/s |")
print("|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(out, "sparq-*-pp*.json"))):
    tag = os.path.basename(f)[6:-5]
    rows = load(f) or []
    if not rows: continue
    r = rows[0]
    n = r["n_prompt"]
    # tok/s from the median time; the range from the fastest and slowest rep
    s_med = r["tok_s"]; s_lo = n / (r["ms_max"] / 1e3); s_hi = n / (r["ms_min"] / 1e3)
    ll = load(os.path.join(out, "llama-%s.json" % tag)) or []
    best = None
    for x in ll:
        if x.get("n_prompt") == n and x.get("n_gen", 0) == 0:
            if best is None or x["avg_ts"] > best["avg_ts"]: best = x
    if best:
        fa = best.get("flash_attn", best.get("fa", "?"))
        lcol = "%.1f ± %.1f (-fa %s)" % (best["avg_ts"], best["stddev_ts"], fa)
        ratio = "%.2fx" % (s_med / best["avg_ts"])
    else:
        lcol, ratio = "not measured", "-"
    model = tag.rsplit("-pp", 1)[0]
    print("| %s | %d | %.1f (%.1f..%.1f) | %s | %s | %.1f |" % (model, n, s_med, s_lo, s_hi, lcol, ratio, r.get("gflop_s", float("nan"))))
t1 = load(os.path.join(out, "sparq-threads1.json")) or []
t2 = load(os.path.join(out, "sparq-smollm2-135m-Q8_0-pp512.json")) or []
if t1 and t2:
    print("\nsmollm2-135m Q8_0 pp512: %.1f tok/s at 1 thread, %.1f at %d: %.2fx" % (t1[0]["tok_s"], t2[0]["tok_s"], t2[0]["threads"], t2[0]["tok_s"] / t1[0]["tok_s"]))
if peak:
    print("\nbench peak (GOP/s or GFLOP/s, measured):")
    for p in peak:
        print("- %s, %d thread(s): %.1f G(FL)OP/s" % (p["test"], p["threads"], p["gflop_s"]))
PY
log "done: $OUT"
