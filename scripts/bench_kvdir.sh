#!/usr/bin/env bash
# bench_kvdir.sh - time to first token for a question about a document that
# another replica prefilled, against a cold prefill.
# Two `sparq serve` replicas, A and B, share one fresh --kv-dir on loopback.
#
# usage: scripts/bench_kvdir.sh [--quick] [--out | --results DIR] [--llama-1b] [-r R]
#                               [-d TOKENS[,TOKENS...]] [-g TOKENS] [--no-plain] [--no-ban-bytes]
#   --quick            smoke test: the `tiny` gen-model shape, a 1024-token document, R=1
#   --out              results in docs/bench-results/kvdir-<UTC date>/ (to commit)
#   --results DIR      results in DIR (default /tmp/sparq-bench-kvdir)
#   --llama-1b         also the llama-3.2-1b shape (Q8_0), after smollm2-135m
#   -r R               repetitions, each with fresh servers and a fresh directory (default 3)
#   -d T1,T2,...       document lengths in tokens, multiples of 512 (default 4096,16384)
#   -g TOKENS          tokens generated per question (default 4; only the first is timed)
#   --no-plain         skip the cold prefill on a replica without --kv-dir (see (1b))
#   --no-ban-bytes     send no logit_bias (see below)
# environment:
#   MODEL_DIR=DIR      generated models (default /tmp/sparq-bench-models, shared with bench.sh)
#   THREADS=N          threads per replica (default 2; only one replica computes at a time)
#   PREFIX_MIB=N       each replica's --prefix-cache (default 2048: a 16k-token llama-3.2-1b
#                      document is 512 MiB, more than the server's 256 MiB default)
#   UP_TIMEOUT=SEC     how long a replica may take to listen and answer /health (default 300)
#   REQ_TIMEOUT=SEC    the replicas' --timeout (default 36000)
#   WORK=DIR           prompts, kv-dirs and server logs (default /tmp/sparq-bench-kvdir-work)
#
# Per model and document length D, repeated R times, each time with two
# freshly started replicas and an empty kv-dir (WORK/kv):
#   sparq serve -m M -c (D+512+G) -t THREADS --parallel 1 --host 127.0.0.1 --port 0 --port-file F
#               --prefix-cache PREFIX_MIB --kv-dir WORK/kv --kv-dir-max 0 --timeout REQ_TIMEOUT
# Both replicas first answer a warm-up request (8 tokens, nothing cached, not
# timed) so page faults of the weights fall outside the measurements. Then:
#   (1)  cold: A gets document + question 0: an empty kv-dir, an empty prefix
#        cache, the whole prompt prefilled. A then caches the document (its
#        prompt cut at a multiple of the 512-token batch) in memory and writes
#        it to the kv-dir; both happen before the first token is sampled, so
#        they are inside this TTFT.
#   (2)  other replica's file: B, which never saw the document, gets document
#        + question 1: it loads A's file, prefills only the question.
#   (3)  warm: A gets document + question 2: its in-memory prefix cache.
#   (1b) cold, no kv-dir (unless --no-plain): a third replica started without
#        --kv-dir and with --prefix-cache 0 gets question 0: the cold prefill
#        without the cost of caching and writing the file.
# TTFT = from just before the request is written to the arrival of the first
# server-sent event with text (not curl's time_starttransfer, which may be
# the response headers). Each request: temperature 0, stream, ignore_eos, G
# tokens. B's /metrics before and after its question show that it loaded the
# file (sparq_kv_dir_hits_total +1) and prefilled only the question's tokens
# (sparq_prefill_tokens_total); A's, that the warm question hit its memory
# cache. The KV file's size (apparent and allocated) is listed after (1).
# The file is read by B from the page cache of the same machine: a shared
# filesystem across machines adds its read time to (2).
#
# Byte tokens: gen-model's SentencePiece vocabulary has the 256 byte tokens
# <0x00>..<0xFF> at ids 3..258. With random weights the greedy token may be
# one that is not yet valid UTF-8, whose text the server holds back, so the
# first event with text would come later than the first token; every
# request therefore carries OpenAI's "logit_bias" with -100 on ids 3..258
# (as in bench_serve.sh).
#
# Results: RESULTS/commands.txt (every command, in order), per repetition
# RESULTS/<model>-<D>-r<i>/ with meta.json, the client's JSON per question
# (cold.json, other.json, warm.json, plain.json), the /metrics dumps
# (metrics-{A,B}-*.txt), kvfiles.txt (name, size, allocated bytes of each
# file in the kv-dir after (1)), and RESULTS/report.md (also printed):
# model, document tokens, each TTFT as median (min-max), the speedups
# cold / other and cold / warm, B's kv-dir hits and prefilled tokens, and the
# file's MiB on disk.
#
# Exact commands for the issue's numbers (on a quiet machine):
#   scripts/bench_kvdir.sh --out --llama-1b
#   scripts/bench_kvdir.sh --quick                (smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."

R=3 DOCS=4096,16384 G=4 L1B=0 PLAIN=1 BAN=1 QUICK=0 RES=/tmp/sparq-bench-kvdir
die() { echo "bench_kvdir.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 R=1 DOCS=1024 ;;
    --out) RES="docs/bench-results/kvdir-$(date -u +%Y-%m-%d)" ;;
    --results) RES="$2"; shift ;;
    --llama-1b) L1B=1 ;;
    -r) R="$2"; shift ;;
    -d) DOCS="$2"; shift ;;
    -g) G="$2"; shift ;;
    --no-plain) PLAIN=0 ;;
    --no-ban-bytes) BAN=0 ;;
    -h|--help) sed -n '2,71p' "$0"; exit 0 ;;
    *) echo "bench_kvdir.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in R G; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"; done
IFS=, read -r -a DOC_LIST <<<"$DOCS"
[ "${#DOC_LIST[@]}" -gt 0 ] || die "-d: no document length"
# the server's default batch: a prompt's cached prefix is cut at a multiple of it
NB=512
for d in "${DOC_LIST[@]}"; do
  { [[ "$d" =~ ^[1-9][0-9]*$ ]] && [ $((d % NB)) = 0 ]; } || die "-d: '$d' is not a positive multiple of $NB"
done
MODEL_DIR=${MODEL_DIR:-/tmp/sparq-bench-models}
THREADS=${THREADS:-2}
PREFIX_MIB=${PREFIX_MIB:-2048}
UP_TIMEOUT=${UP_TIMEOUT:-300}
REQ_TIMEOUT=${REQ_TIMEOUT:-36000}
WORK=${WORK:-/tmp/sparq-bench-kvdir-work}
BYTE_IDS=3-258
SPARQ=./build/sparq
CLIENT=scripts/bench_kvdir_client.mjs
TEXT_DIR=../shared/data/text

command -v node >/dev/null || die "node (20 or later) is needed for the client"
command -v curl >/dev/null || die "curl is needed for /health and /metrics"
make -s build/sparq >&2 || die "cannot build build/sparq"
mkdir -p "$RES" "$WORK" "$MODEL_DIR"
rm -rf "$RES"/*-r[0-9]* "$RES/report.md" "$WORK"/prompts-*.json "$WORK"/*.log "$WORK"/*.port "$WORK/kv"
CMDS="$RES/commands.txt"
{
  echo "# bench_kvdir.sh $(date -u +%FT%TZ) on $(uname -n): $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# sparq $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty')"
} > "$CMDS"
log() { echo "bench_kvdir.sh: $*" >&2; }
# run CMD...: recorded in commands.txt, then run
run() { echo "${*}" >> "$CMDS"; "$@"; }

# replicas by name (A, B, C): pid and URL
declare -A PID=() URL=()
stop_replica() {
  local n="$1" p="${PID[$1]:-}"
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  fi
  PID[$n]=""
}
stop_all() { for n in "${!PID[@]}"; do stop_replica "$n"; done; }
trap stop_all EXIT

# start_replica NAME MODEL CTX [EXTRA ARGS...]: waits for the port file, then /health
start_replica() {
  local n="$1" model="$2" ctx="$3"; shift 3
  local logf="$WORK/$n.log" pf="$WORK/$n.port"
  rm -f "$pf"
  local cmd=("$SPARQ" serve -m "$model" -c "$ctx" -t "$THREADS" --parallel 1 --queue 4 --host 127.0.0.1 --port 0
             --port-file "$pf" --timeout "$REQ_TIMEOUT" "$@")
  echo "${cmd[*]}    # replica $n" >> "$CMDS"
  "${cmd[@]}" > "$logf" 2>&1 &
  PID[$n]=$!
  local t=0
  while [ ! -s "$pf" ]; do
    kill -0 "${PID[$n]}" 2>/dev/null || { PID[$n]=""; die "replica $n exited before listening: $(tail -n1 "$logf") (log: $logf)"; }
    [ "$t" -lt $((UP_TIMEOUT * 5)) ] || die "replica $n did not listen within $UP_TIMEOUT s (log: $logf)"
    sleep 0.2; t=$((t + 1))
  done
  URL[$n]="http://127.0.0.1:$(cat "$pf")"
  until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "${URL[$n]}/health" || true)" = 200 ]; do
    kill -0 "${PID[$n]}" 2>/dev/null || { PID[$n]=""; die "replica $n exited before answering /health (log: $logf)"; }
    [ "$t" -lt $((UP_TIMEOUT * 5)) ] || die "replica $n did not answer /health within $UP_TIMEOUT s (log: $logf)"
    sleep 0.2; t=$((t + 1))
  done
}

BAN_ARGS=()
[ "$BAN" = 0 ] || BAN_ARGS=(--ban-tokens "$BYTE_IDS")
# ask NAME PROMPTS QUESTION OUT [--warmup]
ask() {
  run node "$CLIENT" ask --url "${URL[$1]}" --prompts "$2" --question "$3" --max-tokens "$G" --out "$4" \
    "${BAN_ARGS[@]}" "${@:5}" || die "question $3 to replica $1 failed (log: $WORK/$1.log)"
}
# metrics NAME OUT: the replica's /metrics, kept
metrics() {
  echo "curl -s ${URL[$1]}/metrics > $2" >> "$CMDS"
  curl -sf --max-time 10 "${URL[$1]}/metrics" > "$2" || die "GET ${URL[$1]}/metrics failed"
}

ORDER=0
# bench MODEL_NAME MODEL_FILE DOC_TOKENS
bench() {
  local mname="$1" model="$2" d="$3" ctx=$(($3 + NB + G)) prompts="$WORK/prompts-$1-$3.json"
  ORDER=$((ORDER + 1))
  for rep in $(seq "$R"); do
    local out="$RES/$mname-$d-r$rep" kv="$WORK/kv"
    log "$mname, $d-token document, repetition $rep of $R"
    mkdir -p "$out"
    printf '{"model":"%s","doc_tokens":%d,"rep":%d,"order":%d,"threads":%d,"max_tokens":%d}\n' \
      "$mname" "$d" "$rep" "$ORDER" "$THREADS" "$G" > "$out/meta.json"
    echo "# $mname, $d tokens, repetition $rep" >> "$CMDS"
    run rm -rf "$kv"
    run mkdir "$kv"
    start_replica A "$model" "$ctx" --prefix-cache "$PREFIX_MIB" --kv-dir "$kv" --kv-dir-max 0
    start_replica B "$model" "$ctx" --prefix-cache "$PREFIX_MIB" --kv-dir "$kv" --kv-dir-max 0
    if [ ! -s "$prompts" ]; then
      # tokenized once per model and length, by replica A (no cache involved)
      local qmax
      qmax=$(run node "$CLIENT" prepare --url "${URL[A]}" --out "$prompts" --tokens "$d" --text-dir "$TEXT_DIR") \
        || die "cannot prepare the prompts for $mname, $d tokens"
      # the cached prefix must be the document itself: question shorter than the batch
      [ "$qmax" -lt "$NB" ] || die "a question has $qmax tokens, not fewer than $NB"
    fi
    ask A "$prompts" 0 "$out/warmup-A.json" --warmup
    ask B "$prompts" 0 "$out/warmup-B.json" --warmup
    metrics A "$out/metrics-A-before.txt"
    metrics B "$out/metrics-B-before.txt"
    [ -z "$(ls -A "$kv")" ] || die "the kv-dir $kv is not empty before the cold question"
    # (1) cold, on A
    ask A "$prompts" 0 "$out/cold.json"
    # A writes the file on its writer thread after the answer: the scenario is
    # "another replica prefilled this document earlier", so wait for the write
    # (sparq_kv_dir_pending back to 0) before B is asked
    for _ in $(seq 1200); do
      curl -sf --max-time 10 "${URL[A]}/metrics" | grep -q '^sparq_kv_dir_pending 0$' && break
      sleep 0.5
    done
    metrics A "$out/metrics-A-cold.txt"
    echo "stat -c '%n %s <blocks x block size>' $kv/*.kv > $out/kvfiles.txt" >> "$CMDS"
    : > "$out/kvfiles.txt"
    for f in "$kv"/*.kv; do
      [ -e "$f" ] || continue
      echo "$(basename "$f") $(stat -c '%s' "$f") $(($(stat -c '%b' "$f") * $(stat -c '%B' "$f")))" >> "$out/kvfiles.txt"
    done
    [ -s "$out/kvfiles.txt" ] || log "warning: replica A wrote no KV file (log: $WORK/A.log)"
    # (2) the other replica, from A's file
    ask B "$prompts" 1 "$out/other.json"
    metrics B "$out/metrics-B-after.txt"
    # (3) warm, A's memory cache
    ask A "$prompts" 2 "$out/warm.json"
    metrics A "$out/metrics-A-warm.txt"
    cp "$WORK/A.log" "$out/A.log"; cp "$WORK/B.log" "$out/B.log"
    stop_replica A
    stop_replica B
    # (1b) cold without the kv-dir and the prefix cache
    if [ "$PLAIN" = 1 ]; then
      start_replica C "$model" "$ctx" --prefix-cache 0
      ask C "$prompts" 0 "$out/warmup-C.json" --warmup
      ask C "$prompts" 0 "$out/plain.json"
      metrics C "$out/metrics-C.txt"
      cp "$WORK/C.log" "$out/C.log"
      stop_replica C
    fi
    run rm -rf "$kv"
  done
}

MODELS=("smollm2-135m")
[ "$QUICK" = 0 ] || MODELS=("tiny")
[ "$L1B" = 0 ] || MODELS+=("llama-3.2-1b")
for mname in "${MODELS[@]}"; do
  mfile="$MODEL_DIR/$mname-q8_0.gguf"
  if [ ! -f "$mfile" ]; then
    run "$SPARQ" gen-model --shape "$mname" --type Q8_0 -o "$mfile" >&2 || die "cannot generate $mfile"
  fi
  for d in "${DOC_LIST[@]}"; do bench "$mname" "$mfile" "$d"; done
done

{ grep "^# bench_kvdir\|^# sparq" "$CMDS" | sed "s/^# //; s/$/  /"; echo; node "$CLIENT" report --dir "$RES"; } > "$RES/report.md" \
  || die "cannot write the report"
cat "$RES/report.md" >&2
log "results and commands in $RES; prompts and server logs in $WORK"
