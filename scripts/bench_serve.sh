#!/usr/bin/env bash
# bench_serve.sh - serving benchmark: N concurrent
# streaming clients against `sparq serve` and, when LLAMA_SERVER is set,
# llama.cpp's llama-server on the same GGUF and the same token ids.
#
# usage: scripts/bench_serve.sh [--quick] [--out | --results DIR] [--llama-1b | --only-llama-1b] [--no-shared]
#                               [--prime-shared] [--no-docs] [--no-warm] [--fa LIST] [-n N] [-d TOKENS] [-g TOKENS]
#                               [--shared-tokens TOKENS] [--no-ban-bytes] [--kvu LIST] [--init plain|scaled]
#   --quick            smoke test: N=2, D=513, 8 generated tokens, 1024-token shared document
#                      (sparq caches prefixes cut at multiples of its 512-token batch)
#   --out              results in docs/bench-results/serve-<UTC date>/ (to commit)
#   --results DIR      results in DIR (default /tmp/sparq-bench-serve)
#   --llama-1b         also the llama-3.2-1b shape (Q8_0), after smollm2-135m
#   --only-llama-1b    the llama-3.2-1b shape alone
#   --no-shared        skip the shared-document scenario
#   --prime-shared     also the shared scenario with the document sent alone first
#                      (not counted), as when earlier clients had asked about it
#   --no-docs          skip the docs scenario (and its warm round)
#   --no-warm          skip the docs-warm round (see Scenarios)
#   --fa LIST          llama-server's -fa settings to run, e.g. on (default on,off)
#   --kvu LIST         llama-server's KV layout: 0 (a stream per slot, its default
#                      with -np), 1 (-kvu, one unified buffer) or 0,1 (default 0);
#                      every -fa setting runs with every layout, the best counts
#   --init I           gen-model's weights: plain (default) or scaled (a trained
#                      model's scales, no weight or f16 block scale near a
#                      subnormal; the file is MODEL_DIR/<shape>-q8_0-scaled.gguf)
#   -n N               concurrent clients (default 16)
#   -d TOKENS          prompt tokens per client: own document + question (default 4097:
#                      sparq's prefix cache, cut at multiples of its 512-token batch, then
#                      holds all but the last token, as llama-server's slot cache does)
#   -g TOKENS          generated tokens per request (default 64)
#   --shared-tokens T  prompt tokens in the shared-document scenario (default 16384)
#   --no-ban-bytes     send no logit_bias (see "Byte tokens" below)
# environment:
#   LLAMA_SERVER=/path/to/llama-server  also measure llama-server (-fa on and off; the better counts)
#   LLAMA_SERVER_ARGS="..."             extra llama-server flags (e.g. --mlock)
#   SPARQ_BIN=PATH     the sparq binary (default ./build/sparq; e.g. an A/B of two builds)
#   MODEL_DIR=DIR      generated models (default /tmp/sparq-bench-models, shared with bench.sh)
#   THREADS=N          threads per server (default 2)
#   PORT=N             llama-server's loopback port (default 18471; sparq picks a free one)
#   UP_TIMEOUT=SEC     how long a server may take to answer /health (default 300)
#   REQ_TIMEOUT=SEC    both servers' --timeout (default 36000)
#   WORK=DIR           prompts (token ids) and server logs (default /tmp/sparq-bench-serve-work)
#   SPARQ_LOGIT_BIAS=0 send the byte ban to llama-server only (default 1: to both)
#
# Byte tokens: the models are random weights from `sparq gen-model`, whose
# SentencePiece vocabulary has <unk> <s> </s>, then the 256 byte tokens
# <0x00>..<0xFF> at ids 3..258, then made-up pieces. Greedy decoding of
# random weights soon picks a byte token that makes invalid UTF-8, and
# llama-server then fails the request with HTTP 500 ("The model produced
# output that does not match the expected Content-only format"; its log
# shows "unparsed Content-only output: ... \xNN"). So by default every
# request to llama-server carries OpenAI's "logit_bias" with -100 on ids
# 3..258 (llama-server applies it before sampling, like llama.cpp's -l), and
# so does every request to sparq serve (the same generated tokens on both;
# SPARQ_LOGIT_BIAS=0 leaves sparq's requests without it; the report says
# which runs had the ban). The ban is 256 additions to the logits per token on either
# server: nothing next to a forward pass.
#
# Scenarios, each on a freshly started server (so no run sees another's cache):
#   docs    N clients, each its own D-token prompt (an excerpt of ../shared/data/text
#           plus a question), G tokens each, temperature 0, stream, ignore_eos.
#             sparq serve -m M --parallel N -c (D+G+64) -t THREADS --port 0 --prefix-cache 0 --queue N
#               dense, then SparQ 1/8 per request: "sparq": {"attn": "sparq", "ratio": "1/8"}
#             llama-server -m M -np N -c N*(D+G+64) -t THREADS --port PORT -fa on, then -fa off
#           (both also get --host 127.0.0.1 and --timeout REQ_TIMEOUT)
#   docs-warm  right after docs, on the same server, the same N requests again: both
#           servers hold each prompt but its last token (sparq's prefix cache,
#           --prefix-cache 4096 in this scenario; llama-server's slots), so
#           almost nothing is prefilled and the N streams decode together: its
#           decode tok/s is the aggregate decode throughput at N clients. (In the
#           cold docs run both servers prefill first come first served, so
#           the decode window also holds most of the 16 prefills.)
#   shared  N clients, one shared S-token document, N different questions (the
#           same prefix, a different ending):
#             sparq serve ... -c (S+G+64) --prefix-cache 4096   (dense, then SparQ 1/8)
#             llama-server ... -c N*(S+G+64)  (its default prompt caching), -fa on and off
#           All N requests are sent at once: whether the server notices the
#           common prefix of requests that arrive together is part of the test.
#   shared-primed (with --prime-shared) the same, after one request with the
#           document alone (1 token, not counted) has warmed the prompt caches.
# The exact commands of a run are written to RESULTS/commands.txt. Per run the
# client writes RESULTS/run-*.json (every request's send time, event times,
# TTFT and inter-token latencies, and the aggregates); sparq's /metrics after
# each run is kept as RESULTS/metrics-*.txt (prefill tokens: one prefill in the
# shared scenario shows there). The table (RESULTS/report.md, also printed)
# gives decode tok/s = generated tokens / (last token time - first first-token
# time), generated and total (prompt + generated) tok/s over the wall time,
# TTFT p50/max, inter-token latency p50/p99, and sparq / best llama-server
# (the -fa setting best in that column) for decode and for total tok/s. Which
# figure answers which target: aggregate decode throughput at N clients is
# docs-warm's decode tok/s; a shared document's aggregate throughput is
# shared's total tok/s over the wall clock (its one prefill is the point).
#
# Exact commands for the issue's numbers (on a quiet machine):
#   LLAMA_SERVER=/tmp/llama.cpp/build/bin/llama-server scripts/bench_serve.sh --out --llama-1b --no-shared \
#     --kvu 0,1 --init scaled                 (16 clients x 4097, both shapes, llama-server's four layouts)
#   scripts/bench_serve.sh --quick                                   (smoke test, sparq only)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench_model.sh

N=16 D=4097 G=64 S=16384 DOCS=1 SHARED=1 PRIME=0 WARM=1 FAS="on off" KVUS=0 INIT=plain L1B=0 BAN=1
RES=/tmp/sparq-bench-serve
die() { echo "bench_serve.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) N=2 D=513 G=8 S=1024 ;;
    --out) RES="docs/bench-results/serve-$(date -u +%Y-%m-%dT%H%M)" ;;
    --results) RES="$2"; shift ;;
    --llama-1b) L1B=1 ;;
    --only-llama-1b) L1B=2 ;;
    --no-shared) SHARED=0 ;;
    --prime-shared) PRIME=1 ;;
    --no-warm) WARM=0 ;;
    --no-docs) DOCS=0 ;;
    --fa) FAS="${2//,/ }"; shift
          for f in $FAS; do [ "$f" = on ] || [ "$f" = off ] || die "--fa takes on, off or on,off (got '$2')"; done ;;
    --kvu) KVUS="${2//,/ }"; shift
           for k in $KVUS; do [ "$k" = 0 ] || [ "$k" = 1 ] || die "--kvu takes 0, 1 or 0,1 (got '$2')"; done ;;
    --init) INIT="$2"; shift
            bench_init_ok "$INIT" || die "--init takes plain or scaled (got '$INIT')" ;;
    -n) N="$2"; shift ;;
    -d) D="$2"; shift ;;
    -g) G="$2"; shift ;;
    --shared-tokens) S="$2"; shift ;;
    --no-ban-bytes) BAN=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "bench_serve.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in N D G S; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"; done
MODEL_DIR=${MODEL_DIR:-/tmp/sparq-bench-models}
THREADS=${THREADS:-2}
PORT=${PORT:-18471}
UP_TIMEOUT=${UP_TIMEOUT:-300}
# the prompts (megabytes of token ids) and server logs: not for docs/
WORK=${WORK:-/tmp/sparq-bench-serve-work}
# a request may wait behind N long prefills on 2 cores: far beyond both servers' 600 s default
REQ_TIMEOUT=${REQ_TIMEOUT:-36000}
LLAMA_SERVER=${LLAMA_SERVER:-}
LLAMA_SERVER_ARGS=${LLAMA_SERVER_ARGS:-}
SPARQ_LOGIT_BIAS=${SPARQ_LOGIT_BIAS:-1}
# gen-model's SentencePiece byte tokens <0x00>..<0xFF> (see "Byte tokens" above)
BYTE_IDS=3-258
SPARQ=${SPARQ_BIN:-./build/sparq}
CLIENT=scripts/bench_serve_client.mjs
TEXT_DIR=../shared/data/text

command -v node >/dev/null || die "node (20 or later) is needed for the client"
command -v curl >/dev/null || die "curl is needed to wait for /health"
[ -z "$LLAMA_SERVER" ] || [ -x "$LLAMA_SERVER" ] || die "LLAMA_SERVER='$LLAMA_SERVER' is not an executable"
make -s build/sparq >&2 || die "cannot build build/sparq"
mkdir -p "$RES" "$WORK" "$MODEL_DIR"
rm -f "$RES"/run-*.json "$RES"/metrics-*.txt "$WORK"/prompts-*.json "$WORK"/*.log "$WORK"/*.port
CMDS="$RES/commands.txt"
{
  echo "# bench_serve.sh $(date -u +%FT%TZ) on $(uname -n): $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# sparq $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty')"
  [ -z "$LLAMA_SERVER" ] || echo "# llama-server: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 -i version || echo '?')"
} > "$CMDS"
log() { echo "bench_serve.sh: $*" >&2; }

# llama-server's -fa takes on|off in current versions; older ones had a bare switch
FA_STYLE=value
if [ -n "$LLAMA_SERVER" ]; then
  HELP=$("$LLAMA_SERVER" --help 2>&1 || true)
  grep -q -- '--flash-attn' <<<"$HELP" || die "'$LLAMA_SERVER --help' lists no --flash-attn: not a llama-server?"
  grep -q -- '--flash-attn.*on|off' <<<"$HELP" || FA_STYLE=switch
fi

SRV_PID=""
stop_server() {
  if [ -n "$SRV_PID" ] && kill -0 "$SRV_PID" 2>/dev/null; then
    kill -TERM "$SRV_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SRV_PID" 2>/dev/null || true
    wait "$SRV_PID" 2>/dev/null || true
  fi
  SRV_PID=""
}
trap stop_server EXIT

# wait_up NAME LOG URL: until GET URL/health is 200; fails loudly if the
# server exits or does not answer within UP_TIMEOUT seconds
wait_up() {
  local name="$1" logf="$2" url="$3" t=0
  while :; do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_PID=""; die "$name exited before answering /health: $(tail -n1 "$logf" 2>/dev/null) (log: $logf)"; }
    if [ -n "$url" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url/health" || true)" = 200 ]; then return 0; fi
    [ "$t" -lt $((UP_TIMEOUT * 5)) ] || die "$name did not answer $url/health within $UP_TIMEOUT s (log: $logf)"
    sleep 0.2
    t=$((t + 1))
  done
}

URL=""
# start_sparq TAG MODEL CTX PREFIX_MIB
start_sparq() {
  local tag="$1" model="$2" ctx="$3" pmib="$4" logf="$WORK/sparq-$1.log" pf="$WORK/sparq-$1.port"
  rm -f "$pf"
  local cmd=("$SPARQ" serve -m "$model" --parallel "$N" -c "$ctx" -t "$THREADS" --host 127.0.0.1 --port 0
             --port-file "$pf" --prefix-cache "$pmib" --queue "$N" --timeout "$REQ_TIMEOUT")
  echo "${cmd[*]}" >> "$CMDS"
  "${cmd[@]}" > "$logf" 2>&1 &
  SRV_PID=$!
  local t=0
  while [ ! -s "$pf" ]; do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_PID=""; die "sparq serve exited before listening: $(tail -n1 "$logf") (log: $logf)"; }
    [ "$t" -lt $((UP_TIMEOUT * 5)) ] || die "sparq serve did not listen within $UP_TIMEOUT s (log: $logf)"
    sleep 0.2; t=$((t + 1))
  done
  URL="http://127.0.0.1:$(cat "$pf")"
  wait_up "sparq serve" "$logf" "$URL"
}

# start_llama TAG MODEL CTX FA(on|off) KVU(0|1)
start_llama() {
  local tag="$1" model="$2" ctx="$3" fa="$4" kvu="$5" logf="$WORK/llama-$1.log"
  curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/health" && die "port $PORT is already in use (set PORT)"
  local fa_args=(-fa "$fa")
  [ "$FA_STYLE" = value ] || { [ "$fa" = on ] && fa_args=(-fa) || fa_args=(); }
  # named both ways, so a later change of llama-server's default cannot swap the two runs
  local kvu_args=(-no-kvu)
  [ "$kvu" = 0 ] || kvu_args=(-kvu)
  # llama-server caps every slot at the model's training context (smollm2-135m: 8192), where sparq serve takes
  # the -c it is given; so that both run the same prompts, a longer slot raises the model's stated context
  # (both generated shapes are arch "llama"; their RoPE does not depend on it)
  local ctx_args=()
  [ "$ctx" -le 8192 ] || ctx_args=(--override-kv "llama.context_length=int:$ctx")
  # shellcheck disable=SC2206 # LLAMA_SERVER_ARGS is split on purpose
  local cmd=("$LLAMA_SERVER" -m "$model" -np "$N" -c $((N * ctx)) -t "$THREADS" --host 127.0.0.1 --port "$PORT"
             --timeout "$REQ_TIMEOUT" "${fa_args[@]}" "${kvu_args[@]}" "${ctx_args[@]}" $LLAMA_SERVER_ARGS)
  echo "${cmd[*]}" >> "$CMDS"
  "${cmd[@]}" > "$logf" 2>&1 &
  SRV_PID=$!
  URL="http://127.0.0.1:$PORT"
  wait_up "llama-server" "$logf" "$URL"
}

ORDER=0
# measure TAG PROMPTS META_JSON [sparq policy args...]
measure() {
  local tag="$1" prompts="$2" meta="$3"; shift 3
  ORDER=$((ORDER + 1))
  local ban=()
  if [ "$BAN" = 1 ] && { [[ "$tag" == llama* ]] || [ "$SPARQ_LOGIT_BIAS" = 1 ]; }; then ban=(--ban-tokens "$BYTE_IDS"); fi
  local cmd=(node "$CLIENT" run --url "$URL" --prompts "$prompts" --max-tokens "$G" --label "$tag"
             --out "$RES/run-$tag.json" --meta "${meta%\}},\"order\":$ORDER}" "${ban[@]}" "$@")
  echo "${cmd[*]}" >> "$CMDS"
  "${cmd[@]}" || die "client run '$tag' failed against $URL"
  if [[ "$tag" == sparq* ]]; then curl -s --max-time 10 "$URL/metrics" > "$RES/metrics-$tag.txt" || true; fi
}

# scenario MODEL_NAME MODEL_FILE SCENARIO TOKENS PREFIX_MIB WARM [--shared [--prime]]
# WARM=1: after each cold run the same requests again on the same server,
# reported as scenario SCENARIO-warm
scenario() {
  local mname="$1" model="$2" scen="$3" tokens="$4" pmib="$5" warm="$6" shared="${7:-}" prime="${8:-}"
  local ctx=$((tokens + G + 64)) prompts="$WORK/prompts-$mname-$scen.json" base="$mname-$scen"
  log "$mname, $scen: $N clients x $tokens prompt tokens, $G generated each"
  local m='{"model":"'"$mname"'","scenario":"'"$scen"'"' mw='{"model":"'"$mname"'","scenario":"'"$scen"'-warm"'
  start_sparq "$base-dense" "$model" "$ctx" "$pmib"
  # the prompts are tokenized once, by sparq; every server gets the same ids
  node "$CLIENT" prepare --url "$URL" --out "$prompts" --n "$N" --tokens "$tokens" --text-dir "$TEXT_DIR" ${shared:+"$shared"} \
    || die "cannot prepare the prompts for $base"
  measure "sparq-$base-dense" "$prompts" "$m"',"server":"sparq","attn":"dense"}' ${prime:+"$prime"}
  [ "$warm" = 0 ] || measure "sparq-$base-dense-warm" "$prompts" "$mw"',"server":"sparq","attn":"dense"}'
  stop_server
  start_sparq "$base-sparq8" "$model" "$ctx" "$pmib"
  local s8=(--sparq-attn sparq --sparq-ratio 1/8)
  measure "sparq-$base-sparq8" "$prompts" "$m"',"server":"sparq","attn":"sparq 1/8"}' "${s8[@]}" ${prime:+"$prime"}
  [ "$warm" = 0 ] || measure "sparq-$base-sparq8-warm" "$prompts" "$mw"',"server":"sparq","attn":"sparq 1/8"}' "${s8[@]}"
  stop_server
  if [ -n "$LLAMA_SERVER" ]; then
    for fa in $FAS; do
      for kvu in $KVUS; do
        local lt="fa$fa" la="-fa $fa"
        [ "$kvu" = 0 ] || { lt="$lt-kvu"; la="$la -kvu"; }
        start_llama "$base-$lt" "$model" "$ctx" "$fa" "$kvu"
        measure "llama-$base-$lt" "$prompts" "$m"',"server":"llama-server","attn":"'"$la"'"}' ${prime:+"$prime"}
        [ "$warm" = 0 ] || measure "llama-$base-$lt-warm" "$prompts" "$mw"',"server":"llama-server","attn":"'"$la"'"}'
        stop_server
      done
    done
  fi
}

MODELS=("smollm2-135m")
[ "$L1B" = 0 ] || MODELS+=("llama-3.2-1b")
[ "$L1B" != 2 ] || MODELS=("llama-3.2-1b")
for mname in "${MODELS[@]}"; do
  mfile=$(bench_model_path "$MODEL_DIR" "$mname" Q8_0 "$INIT")
  [ -s "$mfile" ] || echo "$SPARQ gen-model --shape $mname --type Q8_0 --init $INIT -o $mfile" >> "$CMDS"
  bench_model "$MODEL_DIR" "$mname" Q8_0 "$INIT" > /dev/null || die "cannot generate $mfile"
  echo "# model $mname: $mfile ($INIT weights)" >> "$CMDS"
  [ "$DOCS" = 0 ] || scenario "$mname" "$mfile" docs "$D" "$([ "$WARM" = 1 ] && echo 4096 || echo 0)" "$WARM"
  [ "$SHARED" = 0 ] || scenario "$mname" "$mfile" shared "$S" 4096 0 --shared
  [ "$PRIME" = 0 ] || scenario "$mname" "$mfile" shared-primed "$S" 4096 0 --shared --prime
done

{ grep "^# " "$CMDS" | sed "s/^# //; s/$/  /"; echo; node "$CLIENT" report --dir "$RES"; } > "$RES/report.md" || die "cannot write the report"
cat "$RES/report.md" >&2
log "results and commands in $RES; prompts and server logs in $WORK"
