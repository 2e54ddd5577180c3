#!/usr/bin/env bash
# bench.sh - measures sparq (and llama.cpp's llama-bench on the same GGUF
# files, when given) and writes a report generated from the raw results.
# docs/BENCHMARKS.md is written by hand from the raw files of the main runs
# (it compares several scripts' runs side by side), so the generated report
# goes beside the raw results, never over that page.
#
# usage: scripts/bench.sh [--quick] [--no-perf] [--report-only] [--steps LIST] [--out FILE] [--results DIR]
#                         [--init plain|scaled]
#   --quick        fewer sizes and repetitions, smaller depths (a few minutes)
#   --no-perf      skip the perf profiles of the target points
#   --report-only  measure nothing: rewrite the report from the results DIR
#   --steps LIST   rerun only these steps (e.g. decode_weights,llama_weights),
#                  keeping the other results; the report says which and when
#   --skip LIST    a main run without these steps (e.g. llama_smol_kvq8, whose
#                  scalar path takes hours); machine.txt names them
#   --out FILE     the report (default RESULTS_DIR/REPORT.md)
#   --results DIR  raw JSON, logs and profiles (default /tmp/sparq-bench-results)
#   --init I       gen-model's weights: plain (default) or scaled (a trained
#                  model's scales, so no operand of either engine goes
#                  subnormal; files MODEL_DIR/<shape>-<type>-scaled.gguf)
# environment:
#   LLAMA_BENCH=/path/to/llama-bench   also run llama.cpp (-fa 0 and 1; the better counts)
#   MODEL_DIR=DIR                      generated GGUF models (default /tmp/sparq-bench-models)
#   THREADS=N                          threads for decode and llama-bench (default: all cores)
#   QUIET_WAIT=SECONDS                 before each step, wait up to this long for load < 0.5
#
# Every number in the report comes from this run's raw files; the commands
# that produced them are listed in the report. Run it on a quiet machine: the
# load average is recorded and a warning is printed in the report if it is
# above 0.5. With LLAMA_BENCH a run takes over half an hour on 2 cores, most
# of it llama-bench's prefills to the target depths, and llama-bench's
# q8_0-cache step (flash attention over a quantized cache, a scalar path on
# the CPU) can take longer than all the rest together.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench_model.sh

QUICK=0
PERF=1
REPORT_ONLY=0
STEPS=""
SKIP=""
OUT=
RES=/tmp/sparq-bench-results
INIT=plain
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-perf) PERF=0 ;;
    --report-only) REPORT_ONLY=1 ;;
    --steps) STEPS=",$2,"; shift ;;
    --skip) SKIP=",$2,"; shift ;;
    --out) OUT="$2"; shift ;;
    --results) RES="$2"; shift ;;
    --init) INIT="$2"; shift
            bench_init_ok "$INIT" || { echo "bench.sh: --init takes plain or scaled (got '$INIT')" >&2; exit 2; } ;;
    -h|--help) sed -n '2,/^set /{/^set /!p}' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$RES/REPORT.md}
MODEL_DIR=${MODEL_DIR:-/tmp/sparq-bench-models}
THREADS=${THREADS:-$(nproc)}
LLAMA_BENCH=${LLAMA_BENCH:-}
SPARQ=./build/sparq
PLOT=docs/benchmarks_attn_speedup.png

mkdir -p "$RES" "$MODEL_DIR" "$(dirname "$OUT")"
if [ "$REPORT_ONLY" = 0 ]; then
[ -n "$STEPS" ] || rm -f "$RES"/*.json "$RES"/*.perf.txt "$RES"/commands.txt
CMDS="$RES/commands.txt"
# selected: NAME is run (every step without --steps, less those --skip names)
selected() { [[ "$SKIP" != *",$1,"* ]] && { [ -z "$STEPS" ] || [[ "$STEPS" == *",$1,"* ]]; }; }
T_START=$(date +%s)

log() { echo "bench.sh: $*" >&2; }

# With QUIET_WAIT=SECONDS, waits (at most that long) before each step for
# the 1-minute load average to fall below 0.5.
wait_quiet() {
  local left=${QUIET_WAIT:-0}
  while [ "$left" -gt 0 ] && awk '{ exit !($1 >= 0.5) }' /proc/loadavg; do
    sleep 10
    left=$((left - 10))
  done
}

# run NAME CMD...: runs CMD with stdout to $RES/NAME.json, stderr to
# $RES/NAME.log, and records the command line for the report.
run() {
  local name=$1; shift
  selected "$name" || return 0
  [ -z "$STEPS" ] || sed -i "/^$name \[/d" "$CMDS"
  wait_quiet
  echo "$name [load $(cut -d' ' -f1 /proc/loadavg)]: $*" >> "$CMDS"
  log "$name: $*"
  "$@" > "$RES/$name.json" 2> "$RES/$name.log" || log "$name failed (see $RES/$name.log)"
  return 0
}

# ---- build, models, machine ------------------------------------------------
make -s build/sparq >&2
command -v gnuplot >/dev/null || scripts/setup.sh

SMOL=$(bench_model "$MODEL_DIR" smollm2-135m Q8_0 "$INIT")
L1B=$(bench_model "$MODEL_DIR" llama-3.2-1b Q8_0 "$INIT")
L1B_Q4=$(bench_model "$MODEL_DIR" llama-3.2-1b Q4_K_M "$INIT")

if [ -n "$STEPS" ]; then
  echo "rerun: steps ${STEPS:1:-1} at $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/machine.txt"
else {
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cores: $(nproc) ($(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s) per core)"
  echo "caches: $(lscpu | sed -n 's/^L[23] cache: *//p' | tr '\n' ' ')"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "kernel: $(uname -r)"
  echo "compiler: $(cc --version | head -1)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo 'none (no commit yet)')"
  echo "dirty_files: $(git status --porcelain 2>/dev/null | wc -l)"
  echo "load_before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "quick: $QUICK"
  [ -z "$SKIP" ] || echo "skipped: ${SKIP:1:-1}"
  echo "threads: $THREADS"
  echo "weights: gen-model --init $INIT"
  echo "cpu_id: $(bench_cpu_id) (family/model/stepping)"
  if [ -n "$LLAMA_BENCH" ]; then
    echo "llama_bench: $LLAMA_BENCH"
    echo "llama_build: $("$LLAMA_BENCH" --help >/dev/null 2>&1; git -C "$(dirname "$LLAMA_BENCH")/../.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
  fi
} > "$RES/machine.txt"
fi

# ---- sizes per mode ----------------------------------------------------------
if [ "$QUICK" = 1 ]; then
  REPS=5; S_SWEEP=1k,4k,16k,32k,128k; B_S=4k,32k; RK_R=8,16,32; RK_K=64,128,256
  SMOL_DEPTHS=0,4k,32k; L1B_DEPTHS=0,16k; LB_SMOL=0,8192; LB_L1B=0,4096; NGEN=16
  KVQ8_DEPTHS=0,8k,32k # llama.cpp's quick depth (8192) and the target depth
else
  REPS=10; S_SWEEP=1k,2k,4k,8k,16k,32k,64k,128k,256k,512k,1M; B_S=4k,16k,32k
  RK_R=8,16,32,64; RK_K=64,128,256,512
  SMOL_DEPTHS=0,4k,8k,32k; L1B_DEPTHS=0,4k,16k; LB_SMOL=0,32768; LB_L1B=0,16384; NGEN=32
  KVQ8_DEPTHS=0,32k
fi
TGT="--H 32 --kv-heads 8 --d 128 --kv-type f16"

# ---- sparq: memory bandwidth and the attention operation ---------------------
run membw "$SPARQ" bench membw --size 1024 -t 1,"$THREADS" --reps "$REPS" --json
run attn_target "$SPARQ" bench attn $TGT --S 32k --attn dense,sparq --sparq-r 16 --sparq-k 128 \
  -t 1,"$THREADS" --membw --reps "$REPS" --json
run attn_target_heavy "$SPARQ" bench attn $TGT --S 32k --attn dense,sparq --sparq-r 16 --sparq-k 128 \
  -t "$THREADS" --heavy-tailed-query --reps "$REPS" --json
run attn_S "$SPARQ" bench attn $TGT --S "$S_SWEEP" --attn dense,sparq --sparq-r 16,32 --sparq-k 128 \
  -t "$THREADS" --reps "$REPS" --json --plot "$PLOT" \
  --title "decode attention op, B=1, 32 heads, 8 KV heads, d=128, f16, $THREADS threads"
run attn_B "$SPARQ" bench attn $TGT --B 1,4,16 --S "$B_S" --attn dense,sparq --sparq-r 16 --sparq-k 128 \
  -t "$THREADS" --reps "$REPS" --json
run attn_rk "$SPARQ" bench attn $TGT --S 32k --attn dense,sparq --sparq-r "$RK_R" --sparq-k "$RK_K" \
  -t "$THREADS" --reps "$REPS" --json
run attn_kv "$SPARQ" bench attn --H 32 --kv-heads 8 --d 128 --kv-type f16,f32,q8_0 --S 4k,32k --attn dense,sparq \
  --sparq-r 16 --sparq-k 128 -t 1,"$THREADS" --reps "$REPS" --json
run attn_policies "$SPARQ" bench attn $TGT --S 4k,32k --attn dense,sparq,oracle,flexgen,h2o,streaming \
  --sparq-r 16 --sparq-k 128 --attn-k 128 -t "$THREADS" --reps "$REPS" --json

# ---- sparq: end-to-end decode ------------------------------------------------
run decode_smol "$SPARQ" bench decode -m "$SMOL" --depth "$SMOL_DEPTHS" --attn dense,sparq --sparq-ratio 1/8 \
  --fill random -n "$NGEN" -t "$THREADS" --json
run decode_smol_rk "$SPARQ" bench decode -m "$SMOL" --depth "$SMOL_DEPTHS" --attn sparq --sparq-r 16 --sparq-k 128 \
  --fill random -n "$NGEN" -t "$THREADS" --json
run decode_l1b "$SPARQ" bench decode -m "$L1B" --depth "$L1B_DEPTHS" --attn dense,sparq --sparq-ratio 1/8 \
  --fill random -n "$NGEN" -t "$THREADS" --json
# the quantized KV cache: f16 and q8_0 KV in one step (the target is their
# ratio at 32k), dense and SparQ 1/8 on each
run decode_smol_kvq8 "$SPARQ" bench decode -m "$SMOL" --depth "$KVQ8_DEPTHS" --attn dense,sparq --sparq-ratio 1/8 \
  --kv-type f16,q8_0 --fill random -n "$NGEN" -t "$THREADS" --json
# weights-bound decode (depth 0) at 1 thread and all threads, both quant types
run decode_weights "$SPARQ" bench decode -m "$L1B" --depth 0 --attn dense -n "$NGEN" -t 1,"$THREADS" --json
run decode_weights_q4 "$SPARQ" bench decode -m "$L1B_Q4" --depth 0 --attn dense -n "$NGEN" -t 1,"$THREADS" --json
# the same decode after a real prefill, to check that random fill times alike
run decode_smol_prefill "$SPARQ" bench decode -m "$SMOL" --depth 4k --attn dense,sparq --sparq-ratio 1/8 \
  --fill prefill -n "$NGEN" -t "$THREADS" --json

# ---- llama.cpp on the same files ----------------------------------------------
if [ -n "$LLAMA_BENCH" ]; then
  if [ -x "$LLAMA_BENCH" ]; then
    run llama_smol "$LLAMA_BENCH" -m "$SMOL" -p 0 -n "$NGEN" -d "$LB_SMOL" -fa 0,1 -t "$THREADS" -r 3 --progress -o json
    run llama_l1b "$LLAMA_BENCH" -m "$L1B" -p 0 -n "$NGEN" -d "$LB_L1B" -fa 0,1 -t "$THREADS" -r 3 --progress -o json
    # its quantized KV cache (llama.cpp needs flash attention for a quantized V)
    run llama_smol_kvq8 "$LLAMA_BENCH" -m "$SMOL" -p 0 -n "$NGEN" -d "$LB_SMOL" -ctk q8_0 -ctv q8_0 -fa 1 \
      -t "$THREADS" -r 3 --progress -o json
    run llama_weights "$LLAMA_BENCH" -m "$L1B" -p 0 -n "$NGEN" -fa 0 -t 1,"$THREADS" -r 3 -o json
    run llama_weights_q4 "$LLAMA_BENCH" -m "$L1B_Q4" -p 0 -n "$NGEN" -fa 0 -t 1,"$THREADS" -r 3 -o json
  else
    log "LLAMA_BENCH=$LLAMA_BENCH is not executable; skipping llama.cpp"
  fi
fi

# ---- where the time goes (perf) -------------------------------------------------
profile() { # NAME CMD...: perf record, keep the top symbols
  local name=$1; shift
  selected "perf_$name" || return 0
  wait_quiet
  echo "perf_$name [load $(cut -d' ' -f1 /proc/loadavg)]: perf record -- $*" >> "$CMDS"
  log "perf $name"
  perf record -q -o "$RES/$name.perf.data" -- "$@" > /dev/null 2>> "$RES/perf.log" || return 0
  perf report -i "$RES/$name.perf.data" --stdio --no-children --fields overhead,sym --percent-limit 1.5 2>/dev/null |
    grep -E '^ +[0-9.]+%' | head -15 > "$RES/$name.perf.txt" || true
  rm -f "$RES/$name.perf.data"
}
if [ "$PERF" = 1 ] && command -v perf >/dev/null; then
  # the timed calls dominate: many long samples, the cache fill is short
  profile attn_sparq "$SPARQ" bench attn $TGT --S 32k --attn sparq --sparq-r 16 --sparq-k 128 --skip-dense \
    -t 1 --reps 30 --min-sample-us 200000
  profile attn_dense "$SPARQ" bench attn $TGT --S 32k --attn dense -t 1 --reps 30 --min-sample-us 200000
  profile decode_smol_sparq "$SPARQ" bench decode -m "$SMOL" --depth 32k --attn sparq --sparq-ratio 1/8 \
    --fill random -n 128 -t "$THREADS"
  profile decode_smol_dense "$SPARQ" bench decode -m "$SMOL" --depth 32k --attn dense --fill random -n 64 -t "$THREADS"
fi

if [ -z "$STEPS" ]; then
  echo "load_after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/machine.txt"
  echo "duration_s: $(( $(date +%s) - T_START ))" >> "$RES/machine.txt"
fi
fi # REPORT_ONLY

# ---- the report -----------------------------------------------------------------
python3 - "$RES" "$OUT" "$PLOT" "$MODEL_DIR" <<'PY'
import json, math, os, sys

res, out, plot, model_dir = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def load(name):
    try:
        with open(os.path.join(res, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

machine, reruns = {}, []
with open(os.path.join(res, "machine.txt")) as f:
    for line in f:
        k, _, v = line.partition(": ")
        if k.strip() == "rerun":
            reruns.append(v.strip())
        else:
            machine[k.strip()] = v.strip()
cmds = open(os.path.join(res, "commands.txt")).read().strip().splitlines()

def fmt(v, nd=2):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{nd}f}"

def table(head, rows, left=1):
    """Markdown table; the first `left` columns are text (left-aligned)."""
    s = "| " + " | ".join(head) + " |\n|" + "|".join("---" if i < left else "---:" for i in range(len(head))) + "|\n"
    for r in rows:
        s += "| " + " | ".join(str(c) for c in r) + " |\n"
    return s

def attn_rows(rows, pct=False):
    if not rows:
        return "_not measured (the run failed or was skipped)_\n"
    head = ["policy", "r", "k", "B", "S", "threads", "kv", "median µs", "IQR µs", "min..max µs",
            "MB/call (counted)", "MB/call (formula)", "GB/s"]
    if pct:
        head.append("% of read bw")
    head += ["speed-up vs dense", "theoretical speed-up"]
    out_rows = []
    for r in rows:
        if r["kind"] != "attn":
            continue
        row = [r["policy"] + (" (heavy q)" if r["heavy_query"] else ""), r["r"] or "-", r["k"] or "-", r["B"],
               r["S"], r["threads"], r["kv_type"], fmt(r["median_us"], 1),
               f'{fmt(r["q1_us"], 1)}..{fmt(r["q3_us"], 1)}', f'{fmt(r["min_us"], 1)}..{fmt(r["max_us"], 1)}',
               fmt(r["bytes_counted"] / 1e6, 3), fmt(r["bytes_formula"] / 1e6, 3), fmt(r["gbps"])]
        if pct:
            row.append(fmt(r["pct_bw"], 0))
        row += [fmt(r["speedup_vs_dense"]), fmt(r["theoretical_speedup"])]
        out_rows.append(row)
    return table(head, out_rows)

def decode_rows(rows):
    if not rows:
        return "_not measured (the run failed or was skipped)_\n"
    head = ["model", "policy", "r", "k", "kv", "fill", "depth", "tok/s (median)", "tok/s (mean)", "ms/token",
            "ms weights (depth 0)", "ms attention (rest)", "attention MB/token", "attention GB/s",
            "transfer ratio", "speed-up vs dense", "RSS MiB", "peak RSS MiB"]
    out_rows = []
    for r in rows:
        out_rows.append([r["model"], r["policy"], r["r"] or "-", r["k"] or "-", r.get("kv_type", "f16"), r["fill"],
                         r["depth"],
                         fmt(r["tok_s"]), fmt(r["tok_s_mean"]), fmt(r["ms_token"], 3), fmt(r["ms_weights"], 3),
                         fmt(r["ms_attn"], 3), fmt(r["bytes_counted"] / 1e6, 2), fmt(r["gbps"]),
                         fmt(r["theoretical_ratio"], 4), fmt(r["speedup_vs_dense"]),
                         fmt(r["rss_bytes"] / 1048576, 0), fmt(r["peak_rss_bytes"] / 1048576, 0)])
    return table(head, out_rows, left=2)

def pick(rows, **kw):
    for r in rows or []:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None

def llama_best(rows, depth):
    """The better of -fa 0 and -fa 1 for the tg test at this depth."""
    best = None
    for r in rows or []:
        if r.get("n_gen", 0) > 0 and r.get("n_prompt", 1) == 0 and r.get("n_depth") == depth:
            if best is None or r["avg_ts"] > best["avg_ts"]:
                best = r
    return best

membw = load("membw")
tgt = load("attn_target")
smol, l1b = load("decode_smol"), load("decode_l1b")
lsmol, ll1b = load("llama_smol"), load("llama_l1b")
kvq8, lkvq8 = load("decode_smol_kvq8"), load("llama_smol_kvq8")
threads = int(machine.get("threads", "2"))

def bw(t):
    r = pick(membw, threads=t)
    return r["gbps"] if r else None

# A target is met only by the main run: a row whose numbers come from a
# rerun of its steps (--steps) is reported, but its status says so and it
# does not count as met (a favourable rerun proves nothing).
rerun_steps = set()
for r in reruns:  # "steps a,b,c at DATE, ..."
    if r.startswith("steps "):
        rerun_steps.update(r[len("steps "):].split(" at ")[0].split(","))

def status(ok, *steps):
    if rerun_steps.intersection(steps):
        return "not counted: measured in a rerun (" + ", ".join(sorted(rerun_steps.intersection(steps))) + ")"
    return "met" if ok else "**missed**"
targets = []
# 1. dense op bandwidth
d = pick(tgt, policy="dense", threads=threads)
if d and bw(threads):
    p = 100 * d["gbps"] / bw(threads)
    targets.append(["dense attention op, S=32k, d=128, 32 heads, 8 KV heads, f16",
                    ">= 70% of measured read bandwidth",
                    f'{fmt(d["gbps"])} GB/s of {fmt(bw(threads))} GB/s = {p:.0f}% ({threads} threads)', status(p >= 70)])
s = pick(tgt, policy="sparq", threads=threads)
if s:
    targets.append(["SparQ op, S=32k, d=128, 32 heads, r=16, k=128", ">= 8x faster than our dense op",
                    f'{fmt(s["speedup_vs_dense"])}x (theoretical {fmt(s["theoretical_speedup"])}x)',
                    status(s["speedup_vs_dense"] >= 8)])

def e2e(name, ours, theirs, depth, need_dense, need_sparq, steps):
    ld = llama_best(theirs, depth)
    od = pick(ours, policy="dense", depth=depth)
    os_ = pick(ours, policy="sparq", depth=depth)
    if not ld:
        targets.append([f"{name} decode at depth {depth}", f"dense >= {need_dense}x, sparq 1/8 >= {need_sparq}x llama.cpp",
                        f"llama.cpp not measured at depth {depth} in this run (LLAMA_BENCH unset, or --quick)", "-"])
        return
    fa = "-fa 1" if ld["flash_attn"] == 1 else "-fa 0"
    for pol, o, need in (("dense", od, need_dense), ("sparq 1/8", os_, need_sparq)):
        if not o:
            continue
        x = o["tok_s_mean"] / ld["avg_ts"]
        targets.append([f"{name} Q8_0 decode at depth {depth}: {pol}", f">= {need}x llama.cpp tok/s",
                        f'{fmt(o["tok_s_mean"])} vs {fmt(ld["avg_ts"])} tok/s ({fa}) = {x:.2f}x', status(x >= need, *steps)])

e2e("smollm2-135m", smol, lsmol, 32768, 2.5, 6, ("decode_smol", "llama_smol"))
e2e("llama-3.2-1b", l1b, ll1b, 16384, 1.5, 3, ("decode_l1b", "llama_l1b"))

# q8_0 KV against f16 KV, both dense, from the same step
qd = pick(kvq8, policy="dense", depth=32768, kv_type="q8_0")
fd = pick(kvq8, policy="dense", depth=32768, kv_type="f16")
if qd and fd:
    x = qd["tok_s_mean"] / fd["tok_s_mean"]
    targets.append(["smollm2-135m Q8_0 decode at depth 32768: dense, q8_0 KV cache", ">= 1.6x dense with f16 KV",
                    f'{fmt(qd["tok_s_mean"])} vs {fmt(fd["tok_s_mean"])} tok/s = {x:.2f}x '
                    f'(attention {fmt(qd["bytes_counted"] / 1e6, 1)} vs {fmt(fd["bytes_counted"] / 1e6, 1)} MB/token)',
                    status(x >= 1.6, "decode_smol_kvq8")])

def weights_pairs(ours, theirs):
    """(threads, our row, llama.cpp row) at depth 0 for every thread count both ran."""
    out = []
    for o in ours or []:
        if o["depth"] != 0 or o["policy"] != "dense":
            continue
        for r in theirs or []:
            if r.get("n_gen", 0) > 0 and r.get("n_prompt", 1) == 0 and r.get("n_depth", 0) == 0 \
                    and r.get("n_threads") == o["threads"]:
                out.append((o["threads"], o, r))
    return out

wq8, wq4 = load("decode_weights"), load("decode_weights_q4")
lwq8, lwq4 = load("llama_weights"), load("llama_weights_q4")
for name, ours, theirs, steps in (("llama-3.2-1b Q8_0", wq8, lwq8, ("decode_weights", "llama_weights")),
                                  ("llama-3.2-1b Q4_K_M", wq4, lwq4,
                                   ("decode_weights_q4", "llama_weights_q4"))):
    for t, o, l in weights_pairs(ours, theirs):
        x = o["tok_s_mean"] / l["avg_ts"]
        targets.append([f"{name} decode at depth 0, {t} thread(s)", ">= 1.0x llama.cpp tok/s",
                        f'{fmt(o["tok_s_mean"])} vs {fmt(l["avg_ts"])} tok/s = {x:.2f}x', status(x >= 1.0, *steps)])

doc = []
w = doc.append
w("# Benchmarks\n")
w("Generated by `scripts/bench.sh`%s. Every number below was measured in that run (or in the rerun of single "
  "steps listed under Machine and build: a target whose rows come from a rerun is shown but not counted as met); "
  "the models are random-weight files of real shapes written by `sparq gen-model` (`%s`: plain draws small "
  "values that can go subnormal in either engine's arithmetic; scaled draws them at a trained model's scales); "
  "the raw JSON, logs and "
  "profiles are in `%s`. Regenerate with `scripts/bench.sh` (add `LLAMA_BENCH=/path/to/llama-bench` for the "
  "llama.cpp comparison).\n" % (" --quick" if machine.get("quick") == "1" else "",
                                machine.get("weights", "gen-model --init plain"), res))
w("Top-k attention over a key index has its own page, from runs of `sparq bench-topk`: "
  "[BENCHMARKS_TOPK.md](BENCHMARKS_TOPK.md).\n")
w("## Machine and build\n")
for k in ("date", "cpu", "cores", "caches", "memory", "kernel", "compiler", "commit", "dirty_files",
          "load_before", "load_after", "duration_s", "llama_bench", "llama_build"):
    if k in machine:
        w(f"- {k}: {machine[k]}")
w("")
for r in reruns:
    w(f"- **rerun after the main run:** {r} (these steps' rows come from the rerun; every other row from the main run)")
if reruns:
    w("")
# The 1-minute load average at the start of every step (after the quiet
# wait). Our own previous step's threads still decay in it for a minute or
# two (two busy threads leave about 0.7 after a 60 s wait), so only a load
# above 1.0 means another job was competing.
loads = []
for c in cmds:  # "name [load X]: command"
    if "[load " in c:
        try:
            loads.append(float(c.split("[load ", 1)[1].split("]", 1)[0]))
        except ValueError:
            pass
if loads and max(loads) > 1.0:
    w(f"> **Warning: the machine was not quiet.** The 1-minute load average at the start of a step reached "
      f"{max(loads):.2f} (see Commands); other jobs shared the {machine.get('cores', '?').split()[0]} cores. "
      "Timings are pessimistic and noisier than on an idle machine, multi-threaded ones most of all (a thread "
      "that loses its core stalls the others at every barrier). Ratios measured within one step are more "
      "reliable than absolute numbers.\n")
elif loads:
    w(f"The 1-minute load average at the start of each step was at most {max(loads):.2f} (see Commands; "
      "it includes the decaying load of the previous step's own threads).\n")

w("## Targets\n")
w(table(["target", "wanted", "measured", "status"], targets, left=4) if targets else "_no target could be evaluated_\n")

w("## Read bandwidth (`bench membw`)\n")
w("Sum of a 1 GiB f32 array with AVX-512 loads, median of the repetitions; the roofline for the "
  "attention rows.\n")
if membw:
    w(table(["threads", "MiB", "median µs", "GB/s", "min..max GB/s"],
            [[r["threads"], r["bytes_counted"] >> 20, fmt(r["median_us"], 0), fmt(r["gbps"]),
              f'{fmt(r["bytes_counted"] / r["max_us"] / 1e3)}..{fmt(r["bytes_counted"] / r["min_us"] / 1e3)}']
             for r in membw]))

w("## Attention operation (`bench attn`)\n")
w("The decode attention op alone, as the SparQ paper's microbenchmarks (section 6, appendix F): K and V "
  "~ N(0,1) in a KV cache (plus K^T and the running V sum when SparQ runs), a fresh N(0,1) query per timed "
  "sample, all (batch, KV head) pairs of one call spread over the threads with OpenMP as the model's decode "
  "step does. Time per call: median over the samples (short calls are repeated inside one sample). "
  "Bytes per call: *counted* = elements the kernels measured they read (the rows their loops visited) plus the step's cache append, x element size; *formula* = docs/ALGORITHMS.md's "
  "transfer formula; GB/s = counted bytes / median time (for small S the cache is in L2/L3, so it can "
  "exceed DRAM bandwidth). Theoretical speed-up = dense formula / policy formula.\n")
w("### Target point: S = 32k, d = 128, 32 heads, 8 KV heads, f16\n")
w(attn_rows(tgt, pct=True))
w("With heavy-tailed queries (a few dominant components, `--heavy-tailed-query`):\n")
w(attn_rows(load("attn_target_heavy")))
w("### Speed-up over dense against S (the paper's Figure 8)\n")
if os.path.exists(plot):
    w(f"![speed-up vs S]({os.path.relpath(plot, os.path.dirname(out) or '.')})\n")
w(attn_rows(load("attn_S")))
w("### Batch size\n")
w(attn_rows(load("attn_B")))
w("### SparQ r and k at S = 32k\n")
w(attn_rows(load("attn_rk")))
w("### KV element type and threads\n")
w(attn_rows(load("attn_kv")))
w("### All policies (k = 128)\n")
w(attn_rows(load("attn_policies")))

w("## End-to-end decode (`bench decode`) and llama.cpp\n")
w("Tokens/s of the real decode path (one token per step, logits computed) after the cache reached the "
  "depth. `fill random` = `sparq_context_fill_random` (random keys and values, no prefill: timing only, "
  "the outputs are meaningless but every byte the decode reads is real); `fill prefill` = a real prefill of "
  "a synthetic token sequence. tok/s (median) = 1 / median time per token; tok/s (mean) = tokens / total "
  "time, the definition llama-bench uses, and the one compared with llama.cpp. Weights vs attention: the "
  "same policy's median ms/token at depth 0 is taken as the weights-only cost and the rest of the time at "
  "depth is attributed to attention (so the attention column also holds any other depth-dependent cost). "
  "Sparq 1/8 = `--sparq-ratio 1/8` (r and k picked for one eighth of dense's transfer at the depth).\n")
w("### smollm2-135m Q8_0\n")
w(decode_rows((smol or []) + (load("decode_smol_rk") or [])))
w("#### q8_0 KV cache (`--kv-type q8_0`) beside f16, in one step\n")
w("K, V and SparQ's K^T in Q8_0 blocks (32 values, an f16 scale: 34 bytes where f16 takes 64); "
  "attention MB/token is the bytes of that type. llama.cpp's counterpart is `-ctk q8_0 -ctv q8_0 -fa 1` "
  "(rows with type_k q8_0 below).\n")
w(decode_rows(kvq8))
w("Random fill vs real prefill at depth 4k:\n")
w(decode_rows(load("decode_smol_prefill")))
w("### llama-3.2-1b Q8_0\n")
w(decode_rows(l1b))
w("### Weights-bound decode (depth 0): llama-3.2-1b Q8_0 and Q4_K_M, 1 thread and all threads\n")
w("Interleaved with llama-bench in the same run (llama.cpp rows below); at depth 0 the time is the weight "
  "matmuls, so this compares the quant kernels and the threading.\n")
w(decode_rows((wq8 or []) + (wq4 or [])))
w("### llama.cpp (llama-bench -p 0 -d DEPTH, the same GGUF files)\n")
lrows = [r for r in (lsmol or []) + (lkvq8 or []) + (ll1b or []) + (lwq8 or []) + (lwq4 or [])
         if r.get("n_gen", 0) > 0]
if lrows:
    w(table(["model", "flash_attn", "type_k/type_v", "depth", "n_gen", "threads", "tok/s (mean)", "stddev"], left=1,
            rows=[[os.path.basename(r["model_filename"]), r["flash_attn"],
                   f'{r.get("type_k", "f16")}/{r.get("type_v", "f16")}', r["n_depth"], r["n_gen"], r["n_threads"],
                   fmt(r["avg_ts"]), fmt(r["stddev_ts"])] for r in lrows]))
else:
    w("_not measured: run with LLAMA_BENCH=/path/to/llama-bench_\n")

w("### Comparison with llama.cpp at every depth both measured\n")
cmp_rows = []
# each KV type against llama.cpp's run with the same cache type
kvq8_q8 = [r for r in kvq8 or [] if r.get("kv_type") == "q8_0"]
for ours, theirs in ((smol, lsmol), (kvq8_q8, lkvq8), (l1b, ll1b)):
    for o in ours or []:
        ld = llama_best(theirs, o["depth"])
        if ld:
            cmp_rows.append([o["model"], o["policy"], o.get("kv_type", "f16"), o["depth"], fmt(o["tok_s_mean"]),
                             fmt(ld["avg_ts"]), "1" if ld["flash_attn"] == 1 else "0",
                             fmt(o["tok_s_mean"] / ld["avg_ts"])])
w(table(["model", "policy", "kv", "depth", "sparq tok/s (mean)", "llama.cpp best tok/s", "llama.cpp -fa",
         "ratio"], cmp_rows, left=3) if cmp_rows else "_no depth measured by both_\n")

w("## Analysis (derived from the numbers above)\n")
notes = []
bwt = bw(threads)
for t in (1, threads):
    d_ = pick(tgt, policy="dense", threads=t)
    s_ = pick(tgt, policy="sparq", threads=t)
    if d_ and bw(t):
        notes.append(f"- Dense op, S=32k, {t} thread(s): {fmt(d_['gbps'])} GB/s = "
                     f"{100 * d_['gbps'] / bw(t):.0f}% of the {fmt(bw(t))} GB/s read bandwidth.")
    if s_ and bw(t):
        bound_us = s_["bytes_counted"] / (bw(t) * 1e3)
        notes.append(f"- SparQ op (r=16, k=128), S=32k, {t} thread(s): moves {fmt(s_['bytes_counted'] / 1e6, 2)} MB "
                     f"per call, which at the measured read bandwidth takes {fmt(bound_us, 1)} µs; it takes "
                     f"{fmt(s_['median_us'], 1)} µs ({s_['median_us'] / bound_us:.1f}x the bandwidth bound), so "
                     f"its speed-up is limited by computation (scoring all S positions, softmax, top-k, "
                     f"gather; see the profile below), not by memory traffic.")
# the files this run read (the --init suffix is in their names)
suffix = "" if machine.get("weights", "gen-model --init plain").endswith("plain") else "-scaled"
for rows, path in ((smol, f"smollm2-135m-q8_0{suffix}.gguf"), (l1b, f"llama-3.2-1b-q8_0{suffix}.gguf")):
    full = os.path.join(model_dir, path)
    z = pick(rows, policy="dense", depth=0)
    if z and os.path.exists(full) and bwt:
        size = os.path.getsize(full)
        gbs = size / (z["ms_token"] * 1e6)
        notes.append(f"- {path} at depth 0: {fmt(z['ms_token'], 2)} ms/token for a {size / 1e6:.0f} MB file = "
                     f"{fmt(gbs)} GB/s of weights, {100 * gbs / bwt:.0f}% of read bandwidth.")
    for r in rows or []:
        if r["depth"] > 0 and r["gbps"] is not None and bwt:
            notes.append(f"- {path} {r['policy']} at depth {r['depth']}: attention reads "
                         f"{fmt(r['bytes_counted'] / 1e6, 1)} MB/token in {fmt(r['ms_attn'], 2)} ms = "
                         f"{fmt(r['gbps'])} GB/s ({100 * r['gbps'] / bwt:.0f}% of read bandwidth).")
w("\n".join(notes) + "\n" if notes else "_nothing to derive_\n")

w("## Where the time goes (perf)\n")
any_perf = False
for name, what in (("attn_sparq", "SparQ op, S=32k, r=16, k=128, 1 thread"),
                   ("attn_dense", "dense op, S=32k, 1 thread"),
                   ("decode_smol_sparq", "smollm2-135m decode at depth 32k, sparq 1/8"),
                   ("decode_smol_dense", "smollm2-135m decode at depth 32k, dense")):
    p = os.path.join(res, name + ".perf.txt")
    if os.path.exists(p) and os.path.getsize(p) > 0:
        any_perf = True
        w(f"{what} (`perf record`, self time by symbol, >= 1.5%; the cache fill is included):\n")
        w("```\n" + open(p).read().rstrip() + "\n```\n")
if not any_perf:
    w("_no profiles in this run (--no-perf or perf unavailable)_\n")

w("## Commands\n")
w("```\n" + "\n".join(cmds) + "\n```\n")

# The prefill, time-to-answer and serving runs have scripts of their own
# (scripts/bench_prefill.sh, bench_answer.sh, bench_serve.sh), each writing its
# raw results, the machine and commands, and a summary table beside them. They
# are not copied in: this report is one run on one machine, and another
# directory's run may be another day's machine.
with open(out, "w") as f:
    f.write("\n".join(doc))
print(f"bench.sh: wrote {out}", file=sys.stderr)
PY
